"""Long column sums: a reasoning workload where generation dominates, with a thinking budget the model can meet.

A prompt is a column of 24 to 26 digits, each after a letter that names it (``a7b2c9...:``); the shipped
reasoning model (``tiny-reason``) adds them one by one, restating each with the running total::

    a7=007;b2=009;c9=018;...;z4=117;=117

and sometimes checks itself, adding them again from the last, before the answer::

    a7=007;...;z4=117;?z4=004;y1=005;...;a7=117;=117

A scratchpad is 172 to 187 tokens, 341 to 370 with the check (a character a token, EOS included). Which one is drawn is the model's choice, and
the thinking budget decides which pays: a run's budget is stated in front of the prompt (``320|a7b2...:``,
:meth:`LongSum.budget_prompt`), as INTELLECT-2 states a target length, and its length reward
(:mod:`shared.environments.length`) teaches the model to check or not. The reward reads the answer after the
last ``=``; the steps are the model's own business.
"""

from __future__ import annotations

import random
import re
import string

from intellect_protocol.shared.environments.registry import Problem

LABELS = string.ascii_lowercase
ITEMS = (24, len(LABELS))
"""Digits in a column, fewest and most."""
CHECK = "?"
"""Opens the second pass, from the last digit back to the first."""
MAX_TOKENS = 400
"""A completion's limit: the longest scratchpad with its check, the answer and EOS fit."""
ANSWER = re.compile(r"=(\d{1,4})$")
HELD_OUT_SEED = 2025


def make_problem(rng: random.Random, items: tuple[int, int] = ITEMS) -> tuple[str, int]:
    """A prompt of between ``items`` labelled digits, and their sum."""
    digits = [rng.randint(0, 9) for _ in range(rng.randint(*items))]
    return "".join(f"{label}{d}" for label, d in zip(LABELS, digits)) + ":", sum(digits)


def digits_of(prompt: str) -> list[tuple[str, int]]:
    """(label, digit) pairs of a prompt, its budget (if stated) left out."""
    column = prompt.rsplit("|", 1)[-1].rstrip(":")
    return [(column[i], int(column[i + 1])) for i in range(0, len(column), 2)]


def _pass(items: list[tuple[str, int]]) -> str:
    total, steps = 0, []
    for label, digit in items:
        total += digit
        steps.append(f"{label}{digit}={total:03d};")  # a fixed width: the last total is always as far back
    return "".join(steps)


def scratchpad(prompt: str, check: bool) -> str:
    """The reference completion for ``prompt`` (without EOS), with the checking pass or without."""
    items = digits_of(prompt)
    answer = f"={sum(d for _, d in items)}"
    return _pass(items) + (CHECK + _pass(items[::-1]) if check else "") + answer


def reward(completion: str, answer: int) -> float:
    """1.0 when the completion ends with ``=<answer>``, else 0.0."""
    match = ANSWER.search(completion.strip())
    return 1.0 if match is not None and int(match.group(1)) == answer else 0.0


def budget_prompt(prompt: str, target_tokens: int) -> str:
    """The prompt with its thinking budget in front, in characters the model's vocabulary has."""
    return f"{target_tokens}|{prompt}"


def held_out_problems(n: int = 200) -> list[tuple[str, int]]:
    """The problems the shipped model's held-out accuracy is measured on (its ``training.json``, the devnet)."""
    rng = random.Random(HELD_OUT_SEED)
    return [make_problem(rng) for _ in range(n)]


class LongSum:
    """Columns of 24 to 26 labelled digits to sum, for the shipped reasoning model."""

    name = "long-sum"
    model = "tiny-reason"
    """The shipped model that knows the scratchpad (the devnet runs it on this environment)."""
    max_tokens = MAX_TOKENS
    """The completion limit the devnet gives this environment's tasks."""

    def __init__(self, count: int = 10_000, seed: int = 0) -> None:
        rng = random.Random(seed)
        made = (make_problem(rng) for _ in range(count))
        self._problems = [Problem(id=f"s{i}", prompt=p, answer=str(a)) for i, (p, a) in enumerate(made)]

    def problems(self) -> list[Problem]:
        return self._problems

    def held_out(self) -> list[Problem]:
        return [Problem(id=f"h{i}", prompt=p, answer=str(a)) for i, (p, a) in enumerate(held_out_problems())]

    def task_reward(self, completion: str, problem: Problem) -> float:
        return reward(completion, int(problem.answer or 0))

    def budget_prompt(self, prompt: str, target_tokens: int) -> str:
        return budget_prompt(prompt, target_tokens)
