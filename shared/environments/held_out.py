"""A run's held-out problems: never handed out as tasks, and what each published policy step is measured on.

An environment may declare its own (a ``held_out()`` method returning :class:`Problem` objects that ``problems()``
does not list). Otherwise the run holds out :data:`SHARE` of ``problems()`` (at most :data:`MOST`), chosen by a
hash of each problem's id: the same problems on every machine and in every run of that environment, whatever
order ``problems()`` lists them in. The coordinator hands out tasks only from the rest.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

from intellect_protocol.shared.environments.registry import Environment, Problem

SHARE = 0.05
MOST = 200


@dataclass(frozen=True)
class HeldOut:
    problems: list[Problem]
    source: str
    """Where they come from, in words: "declared by the environment", or the share taken."""


def held_out(environment: Environment) -> HeldOut:
    declared = getattr(environment, "held_out", None)
    if callable(declared):
        problems = list(declared())
        if not problems or not all(isinstance(p, Problem) for p in problems):
            raise TypeError(f"environment {environment.name!r}: held_out() must return Problem objects")
        return HeldOut(problems, f"{len(problems)} problems declared by the environment")
    listed = environment.problems()
    count = min(MOST, math.ceil(SHARE * len(listed))) if len(listed) > 1 else 0
    chosen = set(sorted((p.id for p in listed), key=lambda i: hashlib.sha256(i.encode()).digest())[:count])
    return HeldOut([p for p in listed if p.id in chosen], f"{count} of its {len(listed)} problems, chosen by a hash of their ids")


def training(environment: Environment) -> list[Problem]:
    """The problems tasks are drawn from: all but the held-out ones."""
    held = {p.id for p in held_out(environment).problems}
    return [p for p in environment.problems() if p.id not in held]
