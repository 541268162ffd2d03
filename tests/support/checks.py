"""A validator's checks run in-process on the shipped model: tasks, honest files, and the verdict on any bytes."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from functools import cache

from intellect_protocol.node.work import finish, generate
from intellect_protocol.shared.environments.registry import Environment, Problem, get_environment, plugin
from intellect_protocol.shared.rollout_file import Rollout, read_rollouts, write_rollouts
from intellect_protocol.shared.schemas import SamplingParams, TaskSpec
from intellect_protocol.validator.checks import CheckSettings, Context, Verdict, validate
from tests.support.adversary import tiny


@cache
def arithmetic() -> tuple[Environment, dict[str, Problem]]:
    """The built-in arithmetic environment and its problems by id."""
    environment = get_environment("arithmetic")
    return environment, {p.id: p for p in environment.problems()}


def make_task(seed: int, prompts: int = 2, samples: int = 4, **sampling: object) -> TaskSpec:
    return TaskSpec(
        task_id=f"task-{seed}",
        run_id="run-test",
        environment="arithmetic",
        environment_version=plugin("arithmetic").pin,
        model="tiny-arith",
        prompt_ids=[f"a{(seed * prompts + i) % 10_000}" for i in range(prompts)],
        samples_per_prompt=samples,
        seed=seed,
        policy_step=0,
        sampling=SamplingParams(**{"temperature": 1.0, "max_tokens": 48, **sampling}),
        length_alpha=0.0,
        target_length=1024,
        length_over_only=False,
        lease_expires_at=datetime.now(UTC) + timedelta(minutes=5),
    )


def honest(task: TaskSpec) -> bytes:
    return finish(generate(task)).data


def check(data: bytes, task: TaskSpec, settings: CheckSettings | None = None, window: tuple[int, int] = (0, 0)) -> Verdict:
    ctx = Context(task, hashlib.sha256(data).hexdigest(), window[0], window[1], *tiny(), *arithmetic())
    return validate(data, ctx, settings)


def rewrite(data: bytes, change: Callable[[list[Rollout]], None]) -> bytes:
    rollouts = read_rollouts(data)
    change(rollouts)
    return write_rollouts(rollouts)


def failed(verdict: Verdict) -> dict[str, str]:
    return {c.name: c.reason for c in verdict.checks if c.passed is False}
