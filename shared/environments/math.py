"""Math with verifiable final answers, compared symbolically by ``math-verify``.

The completion's final answer (``\\boxed{...}`` or a plain final expression, as math-verify
extracts it) is compared with the reference. Parsing untrusted LaTeX with sympy can take
unbounded time (``9^{9^{9^9}}``), so every check runs in a worker process that is killed
and replaced when it overruns its time limit. Nothing is ``eval``-ed.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

from intellect_protocol.shared.orphans import exit_with

MAX_TAIL_CHARS = 2_000
"""Only the end of a completion is parsed: the final answer is there, and parsing is costly."""


def _warm() -> None:
    import math_verify  # noqa: F401  (sympy and the LaTeX grammar load once per worker)


def _check(completion_tail: str, answer: str, timeout_s: int) -> bool:
    from math_verify import parse, verify

    # math-verify's own alarms work here (the worker's main thread); the kill is the backstop.
    gold = parse(answer if "$" in answer or "\\boxed" in answer else f"${answer}$", parsing_timeout=timeout_s)
    predicted = parse(completion_tail, parsing_timeout=timeout_s)
    return bool(gold and predicted and verify(gold, predicted, timeout_seconds=timeout_s))


class MathVerifier:
    """Checks answers in a single worker process, restarting it after a timeout."""

    def __init__(self, timeout_s: float = 5.0) -> None:
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._pool: ProcessPoolExecutor | None = None

    def _executor(self) -> ProcessPoolExecutor:
        if self._pool is None:
            self._pool = ProcessPoolExecutor(
                max_workers=1, mp_context=multiprocessing.get_context("spawn"), initializer=exit_with, initargs=(os.getpid(),)
            )
            # Start-up and imports take seconds; they must not count against a check's limit.
            self._pool.submit(_warm).result(timeout=120)
        return self._pool

    def reward(self, completion: str, answer: str) -> float:
        """1.0 when the completion's final answer equals ``answer`` symbolically, else 0.0."""
        with self._lock:
            future = self._executor().submit(_check, completion[-MAX_TAIL_CHARS:], answer, max(1, int(self.timeout_s)))
            try:
                return 1.0 if future.result(timeout=self.timeout_s) else 0.0
            except FutureTimeout:
                self._kill()
                return 0.0

    def _kill(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            for process in list(getattr(pool, "_processes", {}).values()):
                process.kill()
            pool.shutdown(wait=False, cancel_futures=True)

    def close(self) -> None:
        with self._lock:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
                self._pool = None
