"""The environments a run can name, discovered as plugins: each lists its problems and scores a completion of one.

An environment is a Python distribution that registers a factory in the entry-point group
``intellect_protocol.environments`` (``name = "package.module:Factory"``); the factory, called with
no arguments, returns an :class:`Environment`. It brings its own dataset loader (``problems``), its
reward function (``task_reward``, on the completion's text) and its prompt rendering (each problem's
``prompt`` is the user's turn; the network renders it with the model's chat template, when there is
one). The built-in environments register the same way (:mod:`shared.environments.builtin`).

A run pins the distribution, its version and a content hash of the environment's code and data as the
coordinator had them (``package==version sha256=DIGEST``, :attr:`Plugin.pin`): the node, the validator and
the trainer load exactly that, or refuse with :class:`EnvironmentUnavailable`, so a reward is never
recomputed by other code than the one that produced it, even when two installs carry the same version
(an edited built-in, a plugin rebuilt without a version bump). The hash covers every file of the package
that holds the entry point's module (:func:`content_hash`): the built-ins' code and sample datasets live in
``shared/environments/``, a plugin's in its own package. A completion's task reward
becomes its final reward through the run's :class:`~shared.environments.length.LengthBudget`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cache
from importlib.metadata import EntryPoint, entry_points
from importlib.util import find_spec
from pathlib import Path
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


class Rewards(Protocol):
    """What scores a completion: an :class:`Environment`, or its reward in a bounded process
    (:class:`~shared.environments.bounded.BoundedRewards`)."""

    def task_reward(self, completion: str, problem: Problem) -> float: ...


class EnvironmentUnavailable(LookupError):
    """The environment a run names is not installed here, is installed in another version, or does not load."""


BUILTIN = "intellect-protocol"
"""The distribution of the built-in environments (this one)."""

DIGEST_CHARS = 16
"""Hex digits of the content hash a pin carries (64 bits: no honest install collides by chance)."""


def _tree_digest(root: Path) -> str:
    digest = hashlib.sha256()
    files = root.rglob("*") if root.is_dir() else [root]
    for path in sorted(p for p in files if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"):
        name = path.relative_to(root).as_posix() if root.is_dir() else path.name
        digest.update(name.encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()[:DIGEST_CHARS]


def content_hash(module: str) -> str:
    """The hash of the code and data that compute an environment whose entry point is in ``module``: every
    file (by relative path and content) of the package holding it (of the module itself where it is a
    top-level file), read anew at each call (a few small files), without importing the module."""
    spec = find_spec(module)
    if spec is None or spec.origin is None:
        raise EnvironmentUnavailable(f"module {module!r} of an environment's entry point is not installed")
    origin = Path(spec.origin)
    is_package = spec.submodule_search_locations is not None
    root = origin.parent if is_package or "." in module else origin
    return _tree_digest(root.resolve())


@dataclass(frozen=True)
class Plugin:
    """One installed environment: its name, the distribution that provides it and its code's hash."""

    name: str
    package: str
    version: str
    entry: EntryPoint

    @property
    def requirement(self) -> str:
        """What installs it: ``package==version``."""
        return f"{self.package}=={self.version}"

    @property
    def pin(self) -> str:
        """What a run records, and every role must have installed: ``package==version sha256=DIGEST``; for
        a built-in, ``intellect-protocol sha256=DIGEST``: every commit has its own version, but only a change
        to the environments' own code or data may split the network."""
        where = self.package if self.package == BUILTIN else self.requirement
        return f"{where} sha256={content_hash(self.entry.module)}"


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
                f"environment {entry.name!r} is provided by both {other.requirement} and {plugin.requirement}; uninstall one"
            )
        found.setdefault(entry.name, plugin)
    return found


def plugin(name: str, pin: str | None = None) -> Plugin:
    """The installed plugin called ``name``, checked against a run's ``pin`` when given."""
    plugins = installed()
    found = plugins.get(name)
    if found is None:
        wanted = f" (the run pins {pin}: pip install '{_requirement(pin)}')" if pin else ""
        raise EnvironmentUnavailable(
            f"environment {name!r} is not installed{wanted}; installed: {', '.join(sorted(plugins)) or 'none'}"
        )
    if pin is not None and found.pin != pin:
        same_release = _requirement(pin) in (found.requirement, BUILTIN)
        fix = "its code here differs from the run's: install the release whose code the run pins" if same_release else ""
        raise EnvironmentUnavailable(
            f"environment {name!r} is {found.pin} here but the run pins {pin}: rewards must be recomputed by "
            f"the code that produced them ({fix or f'pip install {_requirement(pin)!r}'})"
        )
    return found


def _requirement(pin: str) -> str:
    """The ``package==version`` part of a pin (``intellect-protocol`` for a built-in; older runs pinned it alone)."""
    return pin.split(" ", 1)[0]


@cache
def get_environment(name: str, pin: str | None = None) -> Environment:
    """The environment ``name`` (exactly the ``pin``'s version when given), loaded once per process."""
    found = plugin(name, pin)
    try:
        environment = found.entry.load()()
    except Exception as e:
        raise EnvironmentUnavailable(f"environment {name!r} ({found.requirement}) failed to load: {type(e).__name__}: {e}") from e
    if not isinstance(environment, Environment):
        raise EnvironmentUnavailable(f"environment {name!r} ({found.requirement}) lacks problems() or task_reward()")
    try:
        problems = environment.problems()
    except Exception as e:
        raise EnvironmentUnavailable(
            f"environment {name!r} ({found.requirement}) failed to list its problems: {type(e).__name__}: {e}"
        ) from e
    if not all(isinstance(p, Problem) for p in problems):
        raise EnvironmentUnavailable(f"environment {name!r} ({found.requirement}): problems() must return Problem objects")
    ids = [p.id for p in problems]
    if not problems or len(set(ids)) != len(ids) or not all(ids):
        raise EnvironmentUnavailable(f"environment {name!r} ({found.requirement}) must list problems with unique, non-empty ids")
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
