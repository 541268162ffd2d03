"""A run's held-out problems are its own environment's: declared by it, or a share of its problems chosen by id;
never handed out as tasks; and each policy step is scored on them by the environment's own reward."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from intellect_protocol.coordinator.services.runs import problems as task_problems
from intellect_protocol.shared.environments.arithmetic import held_out_problems
from intellect_protocol.shared.environments.held_out import MOST, SHARE, held_out
from intellect_protocol.shared.environments.length import LengthBudget, within_budget
from intellect_protocol.shared.environments.long_sum import MAX_TOKENS, reward
from intellect_protocol.shared.environments.registry import get_environment, plugin
from intellect_protocol.shared.evaluation import HeldOutTask, greedy_decode, greedy_tokens, held_out_metrics
from intellect_protocol.shared.models import TINY_MODEL_DIR, encode_prompt, load_model
from intellect_protocol.shared.tiny_model import MAX_LEN, greedy_accuracy, prompt_ids
from tests.helpers import install_distribution

# 60 problems of "n:" answered by n's digits reversed; a reward for containing the answer.
REVERSALS = """
from intellect_protocol.shared.environments.registry import Problem

class Reversals:
    name = "reversals"

    def problems(self):
        return [Problem(id=f"r{i}", prompt=f"{i}:", answer=str(i)[::-1]) for i in range(100, 160)]

    def task_reward(self, completion, problem):
        return float(problem.answer in completion)


class Declared(Reversals):
    name = "declared"

    def held_out(self):
        return [Problem(id=f"x{i}", prompt=f"{i}:", answer=str(i)[::-1]) for i in range(500, 510)]
"""


@pytest.fixture
def plugins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    entries = {"reversals": "intellect_reversals:Reversals", "declared": "intellect_reversals:Declared"}
    install_distribution(tmp_path, "intellect-reversals", "1.0.0", entries, REVERSALS)
    monkeypatch.syspath_prepend(str(tmp_path))


@pytest.mark.unit
def test_held_out_problems_are_declared_or_a_share_chosen_by_id_and_never_handed_out(plugins: None) -> None:
    arithmetic = get_environment("arithmetic", plugin("arithmetic").pin)
    found = held_out(arithmetic)
    assert [(p.prompt, int(p.answer or 0)) for p in found.problems] == held_out_problems()
    assert found.source == "200 problems declared by the environment"

    reversals = get_environment("reversals", plugin("reversals").pin)
    found = held_out(reversals)
    assert len(found.problems) == min(MOST, round(SHARE * 60)) == 3
    assert found.source == "3 of its 60 problems, chosen by a hash of their ids"
    shuffled = list(reversals.problems())
    random.Random(1).shuffle(shuffled)
    reversals._problems = shuffled  # type: ignore[attr-defined]  # the order problems() lists them in does not matter
    assert {p.id for p in held_out(reversals).problems} == {p.id for p in found.problems}
    # The coordinator draws tasks from the rest only.
    handed_out = task_problems("reversals", plugin("reversals").pin)
    assert len(handed_out) == 57 and not {p.id for p in found.problems} & set(handed_out)
    declared = held_out(get_environment("declared", plugin("declared").pin))
    assert [p.id for p in declared.problems] == [f"x{i}" for i in range(500, 510)]
    assert len(task_problems("declared", plugin("declared").pin)) == 60


@pytest.mark.integration
def test_a_step_is_scored_on_its_environments_held_out_problems_by_its_own_reward(plugins: None) -> None:
    model, tokenizer = load_model(TINY_MODEL_DIR)
    # Arithmetic: the figure every earlier held-out accuracy was, on the same problems and decoding.
    arithmetic = HeldOutTask.of_run("arithmetic", plugin("arithmetic").pin, None, 0)
    problems = arithmetic.problems[:24]
    width = max(len(prompt_ids(tokenizer, p.prompt)) for p in problems)
    task = HeldOutTask("arithmetic", arithmetic.pin, problems, arithmetic.source, None, MAX_LEN - width)
    expected = greedy_accuracy(model, tokenizer, [(p.prompt, int(p.answer or 0)) for p in problems])
    assert held_out_metrics(model, tokenizer, task)["heldout_accuracy"] == expected
    # A plugin's own split and reward.
    declared = HeldOutTask.of_run("declared", plugin("declared").pin, None, 6)
    assert declared.describe() == "declared: 10 problems declared by the environment"
    heads = [encode_prompt(tokenizer, p.prompt) for p in declared.problems]
    texts = greedy_decode(model, tokenizer, heads, 6)
    manual = sum(float(p.answer in t) for p, t in zip(declared.problems, texts, strict=True)) / 10
    assert held_out_metrics(model, tokenizer, declared, batch=4)["heldout_accuracy"] == manual


@pytest.mark.integration
def test_a_thinking_budget_is_stated_in_every_prompt_and_the_share_kept_to_is_counted() -> None:
    model, tokenizer = load_model("tiny-reason")
    pin = plugin("long-sum").pin
    problems = HeldOutTask.of_run("long-sum", pin, None, MAX_TOKENS).problems[:8]
    unbudgeted = HeldOutTask("long-sum", pin, problems, "", None, MAX_TOKENS)
    assert "heldout_within_budget" not in held_out_metrics(model, tokenizer, unbudgeted)
    for target in (180,):
        budget = LengthBudget(alpha=0.002, target_tokens=target)
        task = HeldOutTask("long-sum", pin, problems, "", None, MAX_TOKENS, budget)
        heads = [encode_prompt(tokenizer, f"{target}|{p.prompt}") for p in problems]  # as nodes state it
        completions = greedy_tokens(model, tokenizer, heads, MAX_TOKENS)
        lengths = [len(c) for c in completions]
        texts = tokenizer.batch_decode(completions, skip_special_tokens=True)
        metrics = held_out_metrics(model, tokenizer, task, batch=8)
        assert metrics["heldout_within_budget"] == sum(within_budget(n, budget) for n in lengths) / len(problems)
        assert metrics["heldout_accuracy"] == sum(reward(t, int(p.answer or 0)) for t, p in zip(texts, problems)) / len(problems)
