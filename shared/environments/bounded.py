"""An environment's reward, computed in a process of its own with bounds on time and memory.

A plugin's ``task_reward`` is someone else's code: it may raise, hang, allocate without end or return
something that is not a number. None of that may take down the node, validator or coordinator calling it.
:class:`BoundedRewards` runs the reward in a child process (started on first use, spawned: no torch, no
model in it) under a soft limit on the address space it adds once started, answers each call within ``timeout_s`` or kills the child
(the next call starts another), and turns every way a reward can fail into :class:`PluginFailure`: one
sentence naming the plugin's ``package==version``, the problem and what went wrong.
"""

from __future__ import annotations

import math
import multiprocessing
import resource
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, cast

from intellect_protocol.shared.environments.registry import Problem, get_environment, plugin


@dataclass(frozen=True)
class RewardLimits:
    timeout_s: float = 60.0
    """Longest one reward call may take (the code environment runs up to a few sandboxed tests of 5 s each), counted
    once the process is ready: its start is no part of any reward's time."""
    start_timeout_s: float = 120.0
    """Longest the reward process may take to start and load the environment (spawning imports the caller's main
    module, torch among it: seconds, more on a loaded machine)."""
    memory_bytes: int = 2 << 30
    """Address space the reward process may add to what it holds once started (a soft limit: bounds a bug, not a
    plugin that lifts it). Counted from the start, not from zero: a spawned child first imports the caller's main
    module, and where that imports a CUDA build of torch it already holds several GiB of mapped libraries."""


class PluginFailure(Exception):
    """A plugin's reward raised, hung, ran out of memory or returned no finite number, for ``problem_id``."""

    def __init__(self, message: str, problem_id: str, completion: str) -> None:
        super().__init__(message, problem_id, completion)  # all three travel when pickled across processes
        self.message, self.problem_id, self.completion = message, problem_id, completion

    def __str__(self) -> str:
        return self.message


class _NotStarted(Exception):
    """The reward process did not get ready: ``what`` says how, as the end of a :class:`PluginFailure`'s sentence."""

    def __init__(self, what: str) -> None:
        super().__init__(what)
        self.what = what


class BoundedRewards:
    """``task_reward`` of the environment ``name`` (at ``pin``), called in a bounded child process."""

    def __init__(self, name: str, pin: str | None, limits: RewardLimits | None = None) -> None:
        self.name, self.pin, self.limits = name, pin, limits or RewardLimits()
        self.requirement = plugin(name, pin).requirement
        self._lock = threading.Lock()  # one call at a time on the one pipe
        self._child: multiprocessing.process.BaseProcess | None = None
        self._conn: Connection | None = None

    def task_reward(self, completion: str, problem: Problem) -> float:
        """The reward of ``completion`` for ``problem``; raises :class:`PluginFailure` instead of anything else."""
        return self.task_rewards([(completion, problem)])[0]

    def task_rewards(self, scored: list[tuple[str, Problem]]) -> list[float]:
        """:meth:`task_reward` of each ``(completion, problem)``, in one exchange with the child: it answers each
        as it is computed (each within the time limit), and stops at the first failure, which is raised."""
        asked = [(problem, completion, (completion,)) for completion, problem in scored]
        return [cast(float, v) for v in self._ask("reward", asked)]  # the child checked each is one

    def reply(self, problem: Problem, seed: int, turns: list[str]) -> str | None:
        """A multi-turn environment's answer to the model's ``turns`` (:mod:`shared.environments.turns`), or None when
        the episode is over; raises :class:`PluginFailure` instead of anything else."""
        return self.replies([(problem, seed, turns)])[0]

    def replies(self, asked: list[tuple[Problem, int, list[str]]]) -> list[str | None]:
        """:meth:`reply` to each ``(problem, seed, turns)``, in one exchange with the child (as :meth:`task_rewards`)."""
        answers = self._ask("reply", [(problem, turns[-1] if turns else "", (seed, turns)) for problem, seed, turns in asked])
        return [None if a is None else str(a) for a in answers]

    def call(self, problem: Problem, seed: int, name: str, arguments: dict[str, Any]) -> str:
        """A tool environment's result of one call (:mod:`shared.environments.tool_calls`); raises
        :class:`PluginFailure` instead of anything else."""
        return str(self._ask("call", [(problem, f"{name}({arguments})", (seed, name, arguments))])[0])

    def _ask(self, method: str, asked: Sequence[tuple[Problem, str, tuple[object, ...]]]) -> list[object]:
        """``method`` on each ``(problem, completion, args)``: one message out, one answer back per item."""
        answers: list[object] = []
        if not asked:
            return answers
        with self._lock:
            try:
                conn = self._connection()
            except _NotStarted as e:
                problem, completion, _ = asked[0]
                raise self._failure(problem, completion, e.what, method) from None
            conn.send((method, [(problem.model_dump(), args) for problem, _, args in asked]))
            for problem, completion, _ in asked:
                if not conn.poll(self.limits.timeout_s):
                    self.close()
                    raise self._failure(problem, completion, f"did not return within {self.limits.timeout_s:g} s", method)
                try:
                    kind, value = conn.recv()
                except (EOFError, OSError):
                    code = _exit_code(self._child)
                    self.close()
                    raise self._failure(
                        problem, completion, f"ended the reward process (exit code {code}; out of memory?)", method
                    ) from None
                if kind == "error":  # the child stops at it: nothing is left on the pipe
                    what = value if value.startswith(("returned", "could not")) else f"raised {value}"
                    raise self._failure(problem, completion, what, method)
                answers.append(value)
        return answers

    def start(self) -> None:
        """Start the child process now instead of at the first call (spawning it imports the caller's main module:
        seconds, where that imports torch); returns once it is ready, or raises RuntimeError."""
        with self._lock:
            try:
                self._connection()
            except _NotStarted as e:
                raise RuntimeError(f"environment {self.name!r} ({self.requirement}): its reward {e.what}") from None

    def close(self) -> None:
        """Stop the child process, if any (the next call starts a new one)."""
        if self._child is not None:
            self._child.kill()
            self._child.join()
        if self._conn is not None:
            self._conn.close()
        self._child = self._conn = None

    def _connection(self) -> Connection:
        if self._conn is None:
            context = multiprocessing.get_context("spawn")
            parent, child = context.Pipe()
            process = context.Process(
                target=_serve,
                args=(child, self.name, self.pin, self.limits.memory_bytes),
                daemon=True,
                name=f"reward-{self.name}",
            )
            process.start()
            child.close()
            self._child, self._conn = process, parent
            # The child says when it is ready: a call's time limit then bounds the call, never the start.
            bound = self.limits.start_timeout_s
            if not parent.poll(bound):
                self.close()
                raise _NotStarted(f"could not start: the process loading it took over {bound:g} s")
            try:
                parent.recv()
            except (EOFError, OSError):
                code = _exit_code(process)
                self.close()
                raise _NotStarted(f"could not start: the process loading it ended (exit code {code})") from None
        return self._conn

    def _failure(self, problem: Problem, completion: str, what: str, method: str = "reward") -> PluginFailure:
        message = f"environment {self.name!r} ({self.requirement}) failed on problem {problem.id!r}: its {method} {what}"
        return PluginFailure(message, problem.id, completion)


def _exit_code(process: multiprocessing.process.BaseProcess | None) -> int | None:
    """A child's exit code once its pipe has closed: it is reaped a moment after, so wait for that (briefly)."""
    if process is None:
        return None
    process.join(5)
    return process.exitcode


def task_rewards(rewards: Any, scored: list[tuple[str, Problem]]) -> list[float]:
    """Each ``(completion, problem)``'s reward from ``rewards``: in one exchange where it is a bounded process, one call
    each where it is an environment itself."""
    batch = getattr(rewards, "task_rewards", None)
    return batch(scored) if batch is not None else [float(rewards.task_reward(c, p)) for c, p in scored]


def _serve(conn: Connection, name: str, pin: str | None, memory_bytes: int) -> None:
    """The child: load the environment, then answer each item of a request with ``("ok", value)``, or ``("error", why)``
    and nothing more of that request."""
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = _address_space() + memory_bytes
    resource.setrlimit(resource.RLIMIT_AS, (soft if hard == resource.RLIM_INFINITY else min(soft, hard), hard))
    try:
        environment: Any = get_environment(name, pin)
    except Exception as e:
        environment, load_error = None, f"could not be loaded: {type(e).__name__}: {e}"[:500]
    conn.send(("ready", None))
    while True:
        try:
            method, asked = conn.recv()
        except EOFError:
            return
        for problem, args in asked:
            answer = (
                _call(environment, method, Problem(**problem), args, memory_bytes)
                if environment is not None
                else ("error", load_error)
            )
            conn.send(answer)
            if answer[0] == "error":
                break


def _address_space() -> int:
    """Bytes of address space this process holds now (Linux's /proc/self/statm: its first figure, in pages)."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[0]) * resource.getpagesize()


def _call(environment: Any, method: str, problem: Problem, args: tuple[Any, ...], memory_bytes: int) -> tuple[str, object]:
    try:
        value = environment.task_reward(args[0], problem) if method == "reward" else getattr(environment, method)(problem, *args)
    except MemoryError:
        return "error", f"MemoryError (past the {memory_bytes >> 20} MiB it may add)"
    except Exception as e:
        return "error", f"{type(e).__name__}: {e}"[:500]
    if method == "reply":
        return (
            ("ok", value) if value is None or isinstance(value, str) else ("error", f"returned {value!r:.80}, not text or None")
        )
    if method == "call":
        return ("ok", value) if isinstance(value, str) else ("error", f"returned {value!r:.80}, not text")
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        return "error", f"returned {value!r:.80}, not a finite number"
    return "ok", float(value)
