"""The environments this package ships, registered as plugins like anyone else's (``pyproject.toml``,
entry-point group ``intellect_protocol.environments``): column addition for the tiny model, math with
verified answers, and code run against tests in a sandbox."""

from __future__ import annotations

import random
from pathlib import Path

from intellect_protocol.shared.environments import arithmetic, code
from intellect_protocol.shared.environments.datasets import SAMPLES, DatasetError, load_rows
from intellect_protocol.shared.environments.math import MathVerifier
from intellect_protocol.shared.environments.registry import Problem
from intellect_protocol.shared.environments.sandbox import confinement


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

    def held_out(self) -> list[Problem]:
        """The set the shipped model's held-out accuracy was measured on (drawn with a seed of its own)."""
        return [Problem(id=f"h{i}", prompt=p, answer=str(a)) for i, (p, a) in enumerate(arithmetic.held_out_problems())]

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
        confinement()  # refuse before any completion runs unconfined
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
