"""A task that needs a tool: multiplying a three-digit number by a two-digit one, which a tiny model cannot do in its
head, with a ``calc`` tool it can call.

A prompt is ``"347*28:"``. The model calls the tool by writing an expression between brackets, ``[347*28]``; the
closing bracket ends its turn, and the environment answers with the value (``9716``) or a short error. The episode's
answer is what follows its last ``=``::

    347*28:[347*28]9716=9716        (the environment wrote 9716 after the bracket; the model the rest)

The tool's budget is counted in steps and digits, never in time: a validator replaying the episode on any machine
gets the same reply.
"""

from __future__ import annotations

import random
import re

from intellect_protocol.shared.environments.registry import Problem
from intellect_protocol.shared.environments.turns import Tool

CALL = re.compile(r"\[([^\[\]]*)\]$")
ANSWER = re.compile(r"=(\d{1,12})$")
MAX_STEPS = 16
"""Operations one call may take (a longer expression is refused, not evaluated)."""
MAX_DIGITS = 24
"""Digits a value may reach (past them the tool answers ``overflow``)."""
EXPRESSION = re.compile(r"\d{1,12}([+*]\d{1,12})*")


def make_problem(rng: random.Random) -> tuple[str, int]:
    a, b = rng.randint(100, 999), rng.randint(10, 99)
    return f"{a}*{b}:", a * b


def evaluate(expression: str) -> str:
    """The value of ``expression`` (integers joined by ``+`` and ``*``, ``*`` first), or why there is none."""
    if not EXPRESSION.fullmatch(expression):
        return "error"
    terms = expression.split("+")
    if sum(t.count("*") for t in terms) + len(terms) - 1 > MAX_STEPS:
        return "toolong"
    total = 0
    for term in terms:
        value = 1
        for factor in term.split("*"):
            value *= int(factor)
            if len(str(value)) > MAX_DIGITS:
                return "overflow"
        total += value
    return str(total) if len(str(total)) <= MAX_DIGITS else "overflow"


def reward(completion: str, answer: int) -> float:
    """1.0 when the episode's text ends with ``=<answer>``, else 0.0."""
    match = ANSWER.search(completion.strip())
    return 1.0 if match is not None and int(match.group(1)) == answer else 0.0


class Calculator:
    """Three-digit by two-digit products, with a ``calc`` tool (a multi-turn environment)."""

    name = "calculator"
    tools: list[Tool] = []
    """None declared: the call syntax is taught to the shipped model (``tiny-calc``), whose character vocabulary
    could not even spell a tool's description; an environment for chat models declares its tools (:class:`Tool`)."""
    stops = ("]",)
    max_turns = 4
    max_reply_tokens = 24
    model = "tiny-calc"
    """The shipped model that knows the call syntax (the devnet runs it on this environment)."""

    def __init__(self, count: int = 10_000, seed: int = 0) -> None:
        rng = random.Random(seed)
        made = (make_problem(rng) for _ in range(count))
        self._problems = [Problem(id=f"m{i}", prompt=p, answer=str(a)) for i, (p, a) in enumerate(made)]

    def problems(self) -> list[Problem]:
        return self._problems

    def reply(self, problem: Problem, seed: int, turns: list[str]) -> str | None:  # noqa: ARG002  # the protocol's
        call = CALL.search(turns[-1])
        return evaluate(call.group(1)) if call else "error"

    def call_correct(self, problem: Problem, reply: str) -> bool:
        """A call that computed the problem's product (the share of such calls is charted beside accuracy)."""
        return reply == problem.answer

    def task_reward(self, completion: str, problem: Problem) -> float:
        return reward(completion, int(problem.answer or 0))
