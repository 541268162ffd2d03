"""The environments a run can name: each lists its problems and scores a completion of one.

A completion is scored on its text; a run's :class:`~shared.environments.length.LengthBudget`
turns that task reward into the final reward.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from pydantic import BaseModel

from intellect_protocol.shared.environments import arithmetic, code
from intellect_protocol.shared.environments.datasets import SAMPLES, DatasetError, load_rows
from intellect_protocol.shared.environments.length import LengthBudget, length_penalty
from intellect_protocol.shared.environments.math import MathVerifier

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


class Problem(BaseModel):
    id: str
    prompt: str
    answer: str | None = None
    tests: list[str] | None = None
    pass_rate: float | None = None
    """How often a reference model solves it, when the dataset says (for the trainer's offline filter)."""


class Environment(Protocol):
    name: str

    def problems(self) -> list[Problem]: ...

    def task_reward(self, completion: str, problem: Problem) -> float: ...


class Arithmetic:
    """Generated column-addition problems (``dataset``: a JSONL/Parquet file of them instead)."""

    name = "arithmetic"

    def __init__(self, dataset: Path | None = None, count: int = 10_000, seed: int = 0) -> None:
        if dataset is not None:
            self._problems = [Problem(**row) for row in load_rows(dataset, ("prompt", "answer"))]
        else:
            rng = random.Random(seed)
            made = (arithmetic.make_problem(rng) for _ in range(count))
            self._problems = [Problem(id=f"a{i}", prompt=p, answer=str(a)) for i, (p, a) in enumerate(made)]

    def problems(self) -> list[Problem]:
        return self._problems

    def task_reward(self, completion: str, problem: Problem) -> float:
        return arithmetic.reward(completion, int(problem.answer or 0))


class Math:
    name = "math"

    def __init__(self, dataset: Path | None = None, timeout_s: float = 5.0) -> None:
        rows = load_rows(dataset or SAMPLES / "math_sample.jsonl", ("prompt", "answer"))
        self._problems = [Problem(**row) for row in rows]
        self.verifier = MathVerifier(timeout_s)

    def problems(self) -> list[Problem]:
        return self._problems

    def task_reward(self, completion: str, problem: Problem) -> float:
        return self.verifier.reward(completion, problem.answer or "")


class Code:
    name = "code"

    def __init__(self, dataset: Path | None = None) -> None:
        path = dataset or SAMPLES / "code_sample.jsonl"
        self._problems = [Problem(**row) for row in load_rows(path, ("prompt", "tests"))]
        for problem in self._problems:
            for test in problem.tests or []:
                try:
                    code.parse_test(test)
                except code.UnsupportedTest as e:
                    raise DatasetError(f"{path}: problem {problem.id}: test {test!r}: {e}") from None

    def problems(self) -> list[Problem]:
        return self._problems

    def task_reward(self, completion: str, problem: Problem) -> float:
        return code.reward(completion, problem.tests or [])


ENVIRONMENTS: dict[str, type[Arithmetic] | type[Math] | type[Code]] = {"arithmetic": Arithmetic, "math": Math, "code": Code}


def get_environment(name: str, dataset: Path | None = None) -> Environment:
    try:
        return ENVIRONMENTS[name](dataset)
    except KeyError:
        raise ValueError(f"unknown environment {name!r}; choose one of {', '.join(ENVIRONMENTS)}") from None


def completion_text(tokenizer: PreTrainedTokenizerBase, tokens: list[int]) -> str:
    """The text a completion is scored on: its tokens decoded without special tokens, by node and validator alike."""
    text = tokenizer.decode(tokens, skip_special_tokens=True)
    if not isinstance(text, str):
        raise TypeError(f"decoding one completion gave {type(text).__name__}, not text")
    return text


def reward(task_reward: float, completion_tokens: int, budget: LengthBudget) -> tuple[float, float]:
    """(final reward, length penalty) for a completion of ``completion_tokens`` tokens."""
    penalty = length_penalty(completion_tokens, budget)
    return task_reward - penalty, penalty
