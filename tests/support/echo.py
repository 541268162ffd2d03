"""``echo``, a multi-turn environment on the shipped model, installed as a plugin, and the validator's verdict on its
files: the model writes a column's sum and ";" before the next column, ";" hands the word to the environment, which
answers "c" or "cc" by the row's seed and the turn (at most two replies an episode, of at most three tokens each)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from intellect_protocol.shared.environments.registry import Environment, plugin
from intellect_protocol.shared.environments.turns import rules_of
from intellect_protocol.shared.rollout_file import ReadLimits
from intellect_protocol.shared.schemas import TaskSpec
from intellect_protocol.validator.checks import Context, Verdict, validate
from tests.helpers import installed_environment
from tests.support.adversary import tiny
from tests.support.checks import make_task

ECHO = """
from intellect_protocol.shared.environments.builtin import Arithmetic


class Echo(Arithmetic):
    name = "echo"
    tools = []
    stops = (";",)
    max_turns = 2
    max_reply_tokens = 3

    def reply(self, problem, seed, turns):
        return "c" * (1 + (seed + len(turns)) % 2)
"""


@contextmanager
def echo_environment(site: Path) -> Iterator[Environment]:
    """``echo`` installed in ``site`` and importable while the block runs."""
    with installed_environment(site, "intellect-echo", "echo", "intellect_echo:Echo", ECHO) as found:
        yield found


def echo_task(seed: int, prompts: int = 4) -> TaskSpec:
    base = make_task(seed, prompts=prompts, samples=4, temperature=1.0, max_tokens=48)
    return base.model_copy(update={"environment": "echo", "environment_version": plugin("echo").pin})


def rules_limits(environment: Environment, task: TaskSpec) -> ReadLimits:
    rules = rules_of(environment, task.sampling.max_tokens)
    assert rules is not None
    return ReadLimits(max_environment_tokens=rules.environment_tokens, max_environment_turns=rules.max_turns)


def check(data: bytes, task: TaskSpec, environment: Environment) -> Verdict:
    problems = {p.id: p for p in environment.problems()}
    rules = rules_of(environment, task.sampling.max_tokens)
    ctx = Context(task, hashlib.sha256(data).hexdigest(), 0, 0, *tiny(), environment, problems, rules)  # type: ignore[arg-type]
    return validate(data, ctx)
