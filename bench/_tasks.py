"""Arithmetic tasks as a coordinator would lease them, for the benchmarks that run nodes and validators in one process."""

from __future__ import annotations

import functools
from datetime import UTC, datetime, timedelta

from intellect_protocol.shared.environments.registry import get_environment, plugin
from intellect_protocol.shared.schemas import SamplingParams, TaskSpec
from intellect_protocol.shared.tolerances import Calibration


def environment_task(
    environment: str,
    seed: int,
    model: str,
    temperature: float,
    max_tokens: int,
    prompts: int = 4,
    samples: int = 4,
    tolerances: Calibration | None = None,
    stop_on_eos: bool = True,
) -> TaskSpec:
    """Task ``seed``: ``prompts`` of ``environment``'s problems (the seed picks which, in turn), ``samples`` each, on
    ``model``; ``stop_on_eos=False`` generates every completion to ``max_tokens`` (for timings)."""
    ids = sorted(p.id for p in get_environment(environment).problems())
    return TaskSpec(
        task_id=f"task-{seed}",
        run_id="run-bench",
        environment=environment,
        environment_version=plugin(environment).pin,
        model=model,
        tolerances=tolerances,
        prompt_ids=[ids[(seed * prompts + i) % len(ids)] for i in range(prompts)],
        samples_per_prompt=samples,
        seed=seed,
        policy_step=0,
        sampling=SamplingParams(temperature=temperature, max_tokens=max_tokens, stop_on_eos=stop_on_eos),
        length_alpha=0.0,
        target_length=1024,
        length_over_only=False,
        lease_expires_at=datetime.now(UTC) + timedelta(hours=1),
    )


arithmetic_task = functools.partial(environment_task, "arithmetic")
"""An arithmetic task (:func:`environment_task`), as most benchmarks lease them."""
