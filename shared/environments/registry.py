"""The environments a run can name, discovered as plugins: each lists its problems and scores a completion of one.

An environment is a Python distribution that registers a factory in the entry-point group
``intellect_protocol.environments`` (``name = "package.module:Factory"``); the factory, called with
no arguments, returns an :class:`Environment`. It brings its own dataset loader (``problems``), its
reward function (``task_reward``, on the completion's text) and its prompt rendering (each problem's
``prompt`` is the user's turn; the network renders it with the model's chat template, when there is
one). The built-in environments register the same way (:mod:`shared.environments.builtin`).

A run pins the distribution and version the coordinator had (``package==version``): the node, the
validator and the trainer load exactly that, or refuse with :class:`EnvironmentUnavailable`, so a
reward is never recomputed by other code than the one that produced it. A completion's task reward
becomes its final reward through the run's :class:`~shared.environments.length.LengthBudget`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from importlib.metadata import EntryPoint, entry_points
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from pydantic import BaseModel

from intellect_protocol.shared.environments.length import LengthBudget, length_penalty

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

GROUP = "intellect_protocol.environments"


class Problem(BaseModel):
    id: str
    prompt: str
    answer: str | None = None
    tests: list[str] | None = None
    pass_rate: float | None = None
    """How often a reference model solves it, when the dataset says (for the trainer's offline filter)."""


@runtime_checkable
class Environment(Protocol):
    name: str

    def problems(self) -> list[Problem]: ...

    def task_reward(self, completion: str, problem: Problem) -> float: ...


class EnvironmentUnavailable(LookupError):
    """The environment a run names is not installed here, is installed in another version, or does not load."""


@dataclass(frozen=True)
class Plugin:
    """One installed environment: its name and the distribution that provides it."""

    name: str
    package: str
    version: str
    entry: EntryPoint

    @property
    def pin(self) -> str:
        """What a run records, and every role must have installed: ``package==version``."""
        return f"{self.package}=={self.version}"


def installed() -> dict[str, Plugin]:
    """Every environment installed in this Python environment, by name; a name two distributions
    claim is refused rather than resolved by whichever the import system lists first."""
    found: dict[str, Plugin] = {}
    for entry in entry_points(group=GROUP):
        dist = entry.dist
        plugin = Plugin(entry.name, dist.name if dist else "?", dist.version if dist else "?", entry)
        other = found.get(entry.name)
        if other is not None and other.package != plugin.package:
            raise EnvironmentUnavailable(
                f"environment {entry.name!r} is provided by both {other.pin} and {plugin.pin}; uninstall one"
            )
        found.setdefault(entry.name, plugin)
    return found


def plugin(name: str, pin: str | None = None) -> Plugin:
    """The installed plugin called ``name``, checked against a run's ``pin`` when given."""
    plugins = installed()
    found = plugins.get(name)
    if found is None:
        wanted = f" (the run pins {pin}: pip install '{pin}')" if pin else ""
        raise EnvironmentUnavailable(
            f"environment {name!r} is not installed{wanted}; installed: {', '.join(sorted(plugins)) or 'none'}"
        )
    if pin is not None and found.pin != pin:
        raise EnvironmentUnavailable(
            f"environment {name!r} is {found.pin} here but the run pins {pin}: "
            f"rewards must be recomputed by the code that produced them (pip install '{pin}')"
        )
    return found


@cache
def get_environment(name: str, pin: str | None = None) -> Environment:
    """The environment ``name`` (exactly the ``pin``'s version when given), loaded once per process."""
    found = plugin(name, pin)
    try:
        environment = found.entry.load()()
    except Exception as e:
        raise EnvironmentUnavailable(f"environment {name!r} ({found.pin}) failed to load: {type(e).__name__}: {e}") from e
    if not isinstance(environment, Environment):
        raise EnvironmentUnavailable(f"environment {name!r} ({found.pin}) lacks problems() or task_reward()")
    problems = environment.problems()
    if not all(isinstance(p, Problem) for p in problems):
        raise EnvironmentUnavailable(f"environment {name!r} ({found.pin}): problems() must return Problem objects")
    ids = [p.id for p in problems]
    if not problems or len(set(ids)) != len(ids) or not all(ids):
        raise EnvironmentUnavailable(f"environment {name!r} ({found.pin}) must list problems with unique, non-empty ids")
    return environment


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
