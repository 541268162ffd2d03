"""Column addition with partial credit: an example environment plugin for Intellect Protocol.

A plugin is an ordinary package with one entry point (see ``pyproject.toml``) naming a factory
that returns an object with ``name``, ``problems()`` and ``task_reward(completion, problem)``, and
optionally ``held_out()``: problems never handed out as tasks, on which each policy step is measured
(without it, the run holds out 5 % of ``problems()``).
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


def _load(name: str) -> list[Problem]:
    text = files(__package__).joinpath(name).read_text()
    return [Problem(**json.loads(line)) for line in text.splitlines() if line.strip()]


def columns(prompt: str) -> list[str]:
    """The expected column steps of ``a+b:``, right to left, as ``cK:a+b+carry=sum``."""
    return scratchpad(prompt).split(";")[:-1]


class ColumnCredit:
    """Half the reward for the columns written correctly (in order), half for the final answer."""

    name = "column-credit"

    def __init__(self) -> None:
        self._problems = _load("problems.jsonl")

    def problems(self) -> list[Problem]:
        return self._problems

    def held_out(self) -> list[Problem]:
        return _load("held_out.jsonl")

    def task_reward(self, completion: str, problem: Problem) -> float:
        expected = columns(problem.prompt)
        written = [m.group(0) for m in STEP.finditer(completion)]
        right = sum(w == e for w, e in zip(written, expected))
        answer = ANSWER.search(completion.strip())
        solved = answer is not None and answer.group(1) == problem.answer
        return 0.5 * right / len(expected) + 0.5 * solved
