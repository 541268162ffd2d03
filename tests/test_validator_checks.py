"""The validator's checks against honest work (accepted, whatever the batch size or thread
count) and against each way a node can cheat (rejected by the right check, for the right reason).

Honest files come from the node's own code (:func:`node.work.generate` / :func:`finish`);
each attack rewrites one through the real file format, as a malicious node would.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable

import pytest
import torch

from intellect_protocol.shared.rollout_file import Rollout, read_rollouts
from intellect_protocol.shared.schemas import TaskSpec
from intellect_protocol.validator.checks import CheckSettings, Context, validate
from tests.support.adversary import ATTACKS, inflated_rewards, tiny
from tests.support.checks import arithmetic, check, failed, honest, make_task, rewrite

pytestmark = pytest.mark.unit

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def honest_file() -> tuple[TaskSpec, bytes]:
    """One honest file, generated once for the module's tests."""
    task = make_task(1)
    return task, honest(task)


def test_honest_work_passes_every_check(honest_file: tuple[TaskSpec, bytes]) -> None:
    verdict = check(honest_file[1], honest_file[0])
    assert verdict.accepted, verdict.reason
    assert [c.name for c in verdict.checks] == ["integrity", "assignment", "termination", "toploc", "sampling", "rewards"]


@pytest.mark.parametrize(("attack", "expected"), [(a, e) for _, a, e in ATTACKS], ids=[name for name, _, _ in ATTACKS])
def test_each_attack_is_rejected_by_its_check(
    honest_file: tuple[TaskSpec, bytes], attack: Callable[[list[Rollout], TaskSpec], None], expected: str
) -> None:
    task, data = honest_file
    verdict = check(rewrite(data, lambda rollouts: attack(rollouts, task)), task)
    assert not verdict.accepted
    assert expected in failed(verdict), verdict.reason
    assert verdict.hard == (expected in {"integrity", "toploc", "sampling"})


def test_stale_or_future_policy_steps_and_altered_bytes_are_rejected(honest_file: tuple[TaskSpec, bytes]) -> None:
    task, data = honest_file
    assert "assignment" in failed(check(data, task, window=(1, 3)))  # step 0 is older than the run allows
    ahead = task.model_copy(update={"policy_step": 5})
    assert "assignment" in failed(check(data, ahead, window=(0, 2)))
    ctx_sha = Context(task, "0" * 64, 0, 0, *tiny(), *arithmetic())
    verdict = validate(data, ctx_sha)
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


def test_rewards_can_be_spot_checked_on_a_fraction_of_rows(honest_file: tuple[TaskSpec, bytes]) -> None:
    task, data = honest_file
    inflated = rewrite(data, lambda rollouts: inflated_rewards(rollouts, task))
    assert "rewards" in failed(check(inflated, task, CheckSettings(reward_fraction=1.0)))
    assert check(inflated, task, CheckSettings(reward_fraction=1e-9)).accepted  # no row drawn: nothing recomputed
