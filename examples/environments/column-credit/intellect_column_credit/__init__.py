"""Column addition with partial credit: an example environment plugin for Intellect Protocol.

A plugin is an ordinary package with one entry point (see ``pyproject.toml``) naming a factory
that returns an object with ``name``, ``problems()`` and ``task_reward(completion, problem)``.
This one loads its problems from a file shipped inside the package, words each prompt as the
shipped tiny model expects (``347+285:``), and rewards each correct column step of the written-out
sum, so a completion with the right method and one slip still earns most of the credit.
"""

from __future__ import annotations

import json
import re
from importlib.resources import files

from intellect_protocol.shared.environments.arithmetic import scratchpad
from intellect_protocol.shared.environments.registry import Problem

STEP = re.compile(r"c(\d+):(\d)\+(\d)\+(\d)=(\d\d)")
ANSWER = re.compile(r"=(\d{1,12})$")


def columns(prompt: str) -> list[str]:
    """The expected column steps of ``a+b:``, right to left, as ``cK:a+b+carry=sum``."""
    return scratchpad(prompt).split(";")[:-1]


class ColumnCredit:
    """Half the reward for the columns written correctly (in order), half for the final answer."""

    name = "column-credit"

    def __init__(self) -> None:
        text = files(__package__).joinpath("problems.jsonl").read_text()
        self._problems = [Problem(**json.loads(line)) for line in text.splitlines() if line.strip()]

    def problems(self) -> list[Problem]:
        return self._problems

    def task_reward(self, completion: str, problem: Problem) -> float:
        expected = columns(problem.prompt)
        written = [m.group(0) for m in STEP.finditer(completion)]
        right = sum(w == e for w, e in zip(written, expected))
        answer = ANSWER.search(completion.strip())
        solved = answer is not None and answer.group(1) == problem.answer
        return 0.5 * right / len(expected) + 0.5 * solved
