"""The long-sum environment: its scratchpads, with the check and without, run to the lengths a reasoning workload
needs, and only the answer after the last ``=`` is scored; a run's budget is stated in the model's own characters."""

from __future__ import annotations

import random

import pytest

from intellect_protocol.devnet.run_options import MAX_TOKENS as DEVNET_MAX_TOKENS
from intellect_protocol.devnet.run_options import environment_defaults
from intellect_protocol.shared.environments.long_sum import ITEMS, MAX_TOKENS, LongSum, digits_of, make_problem, scratchpad
from intellect_protocol.shared.environments.registry import get_environment
from intellect_protocol.shared.models import SHIPPED_MODELS
from intellect_protocol.shared.tiny_reason import CHARS, POSITIONS

pytestmark = pytest.mark.unit


def test_scratchpads_are_long_and_only_the_answer_is_scored() -> None:
    environment = get_environment("long-sum")
    assert isinstance(environment, LongSum) and environment.model == "tiny-reason"
    plain, checked = [], []
    for problem in environment.problems()[:500]:
        answer = int(problem.answer or 0)
        items = digits_of(problem.prompt)
        assert ITEMS[0] <= len(items) <= ITEMS[1] and sum(d for _, d in items) == answer
        for check, lengths in ((False, plain), (True, checked)):
            text = scratchpad(problem.prompt, check)
            assert set(text) <= set(CHARS) and environment.task_reward(text, problem) == 1.0
            lengths.append(len(text) + 1)  # a character a token, and EOS
        assert environment.task_reward(scratchpad(problem.prompt, False) + "1", problem) == 0.0
        assert environment.task_reward(scratchpad(problem.prompt, True).rsplit("=", 1)[0], problem) == 0.0
    assert 170 <= min(plain) and max(plain) <= 190 and 340 <= min(checked) and max(checked) <= MAX_TOKENS
    assert max(checked) + len("360|") + 2 * ITEMS[1] + 3 <= POSITIONS  # budget, column, ':' and BOS


def test_the_budget_is_stated_in_front_and_read_past() -> None:
    prompt, answer = make_problem(random.Random(3))
    stated = LongSum(count=1).budget_prompt(prompt, 150)
    assert stated.startswith("150|") and set(stated) <= set(CHARS)
    assert digits_of(stated) == digits_of(prompt) and sum(d for _, d in digits_of(stated)) == answer
    assert scratchpad(stated, True) == scratchpad(prompt, True)


def test_the_devnet_runs_the_environments_own_model_and_length() -> None:
    model, max_tokens = environment_defaults("long-sum")
    assert model == SHIPPED_MODELS["tiny-reason"] and max_tokens == MAX_TOKENS
    assert environment_defaults("arithmetic") == (None, DEVNET_MAX_TOKENS)
    assert environment_defaults("no-such-environment") == (None, DEVNET_MAX_TOKENS)
