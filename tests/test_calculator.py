"""The calculator environment: its tool answers by a budget of steps and digits (never of time), so any machine
replaying an episode gets the same reply, and it scores the episode's final answer."""

from __future__ import annotations

import pytest

from intellect_protocol.shared.environments.calculator import MAX_DIGITS, MAX_STEPS, Calculator, evaluate
from intellect_protocol.shared.environments.registry import get_environment
from intellect_protocol.shared.environments.turns import is_multi_turn, rules_of

pytestmark = pytest.mark.unit


def test_the_tool_evaluates_within_its_budget() -> None:
    assert evaluate("347*28") == "9716" and evaluate("2+3*4") == "14" and evaluate("007") == "7"
    assert evaluate("+".join(["1"] * (MAX_STEPS + 1))) == str(MAX_STEPS + 1)  # MAX_STEPS operations: within the budget
    assert evaluate("+".join(["1"] * (MAX_STEPS + 2))) == "toolong"  # one more is refused unevaluated
    assert evaluate("*".join(["9" * 12] * 3)) == "overflow" and len(evaluate("9" * 12 + "*" + "9" * 12)) <= MAX_DIGITS
    for junk in ("", "1+", "a", "1/2", "1 + 2", "[1]", "1" * 13):
        assert evaluate(junk) == "error", junk


def test_the_environment_answers_the_models_call_and_scores_the_answer() -> None:
    environment = get_environment("calculator")
    assert isinstance(environment, Calculator) and is_multi_turn(environment)
    rules = rules_of(environment, 32)
    assert rules is not None and rules.stops == ("]",) and rules.environment_tokens == 31
    problem = environment.problems()[0]
    a, b = problem.prompt.rstrip(":").split("*")
    assert int(problem.answer or 0) == int(a) * int(b)
    assert environment.reply(problem, 5, [f"[{a}*{b}]"]) == problem.answer
    assert environment.reply(problem, 5, ["=12]"]) == "error"  # a turn that ended on "]" without a call
    assert environment.task_reward(f"[{a}*{b}]{problem.answer}={problem.answer}", problem) == 1.0
    assert environment.task_reward(f"={int(problem.answer or 0) + 1}", problem) == 0.0
    assert environment.call_correct(problem, problem.answer or "") and not environment.call_correct(problem, "error")
