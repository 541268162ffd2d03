"""Guess a number: an example multi-turn environment plugin for Intellect Protocol.

A multi-turn environment adds to a single-turn one (``name``, ``problems()``, ``task_reward``) what its episodes need
(``intellect_protocol.shared.environments.turns``): the ``tools`` it offers (rendered through the model's chat
template), the ``stops`` that end the model's turn, bounds on its replies, and ``reply(problem, seed, turns)``.
Here the model writes ``<guess>N</guess>``; the closing tag ends its turn, and the environment answers ``higher`` or
``lower``, or ends the episode (``reply`` returns None) once the guess is right. The reply is a pure function of the problem and the
model's turns (the secret is the problem's answer, never a clock or a random draw of the environment's own), so a
validator replaying the episode gets the same words. The reward is 1 for finding the number, less a tenth for each
guess after the first.
"""

from __future__ import annotations

import random
import re

from intellect_protocol.shared.environments.registry import Problem
from intellect_protocol.shared.environments.turns import Tool

GUESS = re.compile(r"<guess>\s*(-?\d{1,6})\s*</guess>$")


class GuessNumber:
    name = "guess-number"
    tools = [
        Tool(
            name="guess",
            description="Guess the number: write <guess>N</guess>; the reply is higher or lower, until it is right.",
            parameters={"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]},
        )
    ]
    stops = ("</guess>",)
    max_turns = 8
    max_reply_tokens = 16

    def __init__(self, count: int = 500, seed: int = 0) -> None:
        rng = random.Random(seed)
        self._problems = [
            Problem(
                id=f"g{i}",
                prompt="I am thinking of a number from 1 to 100. Find it in as few guesses as you can.",
                answer=str(rng.randint(1, 100)),
            )
            for i in range(count)
        ]

    def problems(self) -> list[Problem]:
        return self._problems

    def reply(self, problem: Problem, seed: int, turns: list[str]) -> str | None:  # noqa: ARG002  # the protocol's
        guess = _guess(turns[-1])
        secret = int(problem.answer or 0)
        if guess == secret:
            return None  # found: the episode is over
        return "say a number" if guess is None else "higher" if guess < secret else "lower"

    def task_reward(self, completion: str, problem: Problem) -> float:
        guesses = [int(g) for g in re.findall(r"<guess>\s*(-?\d{1,6})\s*</guess>", completion)]
        secret = int(problem.answer or 0)
        if secret not in guesses:
            return 0.0
        return max(0.0, 1.0 - 0.1 * guesses.index(secret))


def _guess(turn: str) -> int | None:
    match = GUESS.search(turn.strip())
    return int(match.group(1)) if match else None
