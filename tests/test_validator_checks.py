"""The validator's checks against honest work (accepted, whatever the batch size or thread
count) and against each way a node can cheat (rejected by the right check, for the right reason).

Honest files come from the node's own code (:func:`node.work.generate` / :func:`finish`);
each attack rewrites one through the real file format, as a malicious node would.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest
import torch

from intellect_protocol.node.work import finish, generate
from intellect_protocol.shared.environments.registry import get_environment, plugin
from intellect_protocol.shared.rollout_file import Rollout, read_rollouts, write_rollouts
from intellect_protocol.shared.schemas import SamplingParams, TaskSpec
from intellect_protocol.validator.checks import CheckSettings, Context, Verdict, validate
from tests.adversary import ATTACKS, MODEL, TOKENIZER, inflated_rewards

pytestmark = pytest.mark.unit

torch.set_num_threads(1)

ENVIRONMENT = get_environment("arithmetic")
PROBLEMS = {p.id: p for p in ENVIRONMENT.problems()}


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
    ctx = Context(task, hashlib.sha256(data).hexdigest(), window[0], window[1], MODEL, TOKENIZER, ENVIRONMENT, PROBLEMS)
    return validate(data, ctx, settings)


def rewrite(data: bytes, change: Callable[[list[Rollout]], None]) -> bytes:
    rollouts = read_rollouts(data)
    change(rollouts)
    return write_rollouts(rollouts)


def failed(verdict: Verdict) -> dict[str, str]:
    return {c.name: c.reason for c in verdict.checks if c.passed is False}


TASK = make_task(1)
HONEST = honest(TASK)


def test_honest_work_passes_every_check() -> None:
    verdict = check(HONEST, TASK)
    assert verdict.accepted, verdict.reason
    assert [c.name for c in verdict.checks] == ["integrity", "assignment", "termination", "toploc", "sampling", "rewards"]


@pytest.mark.parametrize(("attack", "expected"), [(a, e) for _, a, e in ATTACKS], ids=[name for name, _, _ in ATTACKS])
def test_each_attack_is_rejected_by_its_check(attack: Callable[[list[Rollout], TaskSpec], None], expected: str) -> None:
    verdict = check(rewrite(HONEST, lambda rollouts: attack(rollouts, TASK)), TASK)
    assert not verdict.accepted
    assert expected in failed(verdict), verdict.reason
    assert verdict.hard == (expected in {"integrity", "toploc", "sampling"})


def test_stale_or_future_policy_steps_and_altered_bytes_are_rejected() -> None:
    assert "assignment" in failed(check(HONEST, TASK, window=(1, 3)))  # step 0 is older than the run allows
    ahead = TASK.model_copy(update={"policy_step": 5})
    assert "assignment" in failed(check(HONEST, ahead, window=(0, 2)))
    ctx_sha = Context(TASK, "0" * 64, 0, 0, MODEL, TOKENIZER, ENVIRONMENT, PROBLEMS)
    verdict = validate(HONEST, ctx_sha)
    assert failed(verdict) == {"integrity": "the file's sha256 differs from the one stored at upload"} and verdict.hard
    assert not validate(b"not parquet", dataclasses.replace(ctx_sha, sha256=hashlib.sha256(b"not parquet").hexdigest())).accepted


def test_hundreds_of_honest_rollouts_pass_across_batch_sizes_threads_and_chunking() -> None:
    """False rejects: none across 512 honest rollouts of varied shapes, checked with varied
    batch sizes, thread counts and prefill chunking."""
    checked = rejected = 0
    for i in range(32):
        task = make_task(100 + i, prompts=1 + i % 4, samples=4 if i % 2 else 4 * (1 + i % 4), temperature=[1.0, 0.7, 1.3][i % 3])
        data = honest(task)
        torch.set_num_threads(1 + i % 2)
        try:
            verdict = check(data, task, CheckSettings(prefill_batch=[1, 5, 16, 64][i % 4], prefill_chunk=[None, 16, 7][i % 3]))
        finally:
            torch.set_num_threads(1)
        checked += len(read_rollouts(data))
        rejected += 0 if verdict.accepted else 1
        assert verdict.accepted, verdict.reason
    assert checked >= 500 and rejected == 0


def test_rewards_can_be_spot_checked_on_a_fraction_of_rows() -> None:
    inflated = rewrite(HONEST, lambda rollouts: inflated_rewards(rollouts, TASK))
    assert "rewards" in failed(check(inflated, TASK, CheckSettings(reward_fraction=1.0)))
    assert check(inflated, TASK, CheckSettings(reward_fraction=1e-9)).accepted  # no row drawn: nothing recomputed
