"""Whether a run's accepted work can teach GRPO anything, and one sentence when it cannot.

GRPO learns from a group (a prompt's samples) only when their rewards differ. A model that never solves a
task, or always does, yields groups without a spread: the trainer drops them and never steps, while nodes and
validators go on working. The coordinator counts each file's groups as it records it, and sums them over the
work accepted since the run's current policy step was published. When at least :data:`MIN_GROUPS` groups have
come in for :data:`PATIENCE_S` and none has a spread, the run is *stalled*, and the progress route, the page
and the devnet say so, with the figures and what to do.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from intellect_protocol.coordinator.models import Run, Submission
from intellect_protocol.coordinator.shardcast_models import PolicyManifest
from intellect_protocol.shared.rollout_file import Rollout
from intellect_protocol.shared.run_schemas import LearningSignal
from intellect_protocol.shared.states import SubmissionStatus

MIN_GROUPS = 64
"""Groups before a run may be called stalled: a model solving 5 % of problems leaves a group of four samples
without a spread 81 % of the time, and 64 such groups in a row happen about once in a million runs."""
PATIENCE_S = 60.0
"""How long the first of those groups has been accepted before the run is called stalled."""


def file_signal(rollouts: list[Rollout]) -> dict[str, Any]:
    """A file's groups, the groups without a reward spread, and its task rewards' sum (Submission's columns)."""
    rewards: dict[tuple[str, str], set[float]] = defaultdict(set)
    for r in rollouts:
        rewards[(r.task_id, r.prompt_id)].add(r.task_reward)
    flat = sum(len(seen) == 1 for seen in rewards.values())
    return {"groups": len(rewards), "flat_groups": flat, "task_reward_sum": sum(r.task_reward for r in rollouts)}


def learning_signal(session: Session, run: Run, now: datetime) -> LearningSignal:
    """The signal in the work accepted since ``run``'s current policy step was published (its start, at step 0)."""
    published = session.scalar(
        select(PolicyManifest.created_at).where(PolicyManifest.run_id == run.id, PolicyManifest.step == run.policy_step)
    )
    since = published or run.created_at
    groups, flat, reward, rows, first = session.execute(
        select(
            func.sum(Submission.groups),
            func.sum(Submission.flat_groups),
            func.sum(Submission.task_reward_sum),
            func.sum(Submission.rows),
            func.min(Submission.validated_at),
        ).where(
            Submission.run_id == run.id,
            Submission.status == SubmissionStatus.accepted,
            Submission.validated_at >= since,
            Submission.groups.is_not(None),
        )
    ).one()
    groups, flat = groups or 0, flat or 0
    mean = (reward or 0.0) / rows if rows else None
    stalled = None
    if groups >= MIN_GROUPS and flat == groups and first is not None and now - first >= timedelta(seconds=PATIENCE_S):
        stalled = (
            f"No learning signal: {groups} groups accepted since policy step {run.policy_step}, none with a reward spread "
            f"(mean task reward {mean:.2f}), so GRPO has nothing to learn from and the trainer cannot step. Use a model "
            "that already solves some of the problems, an easier task, or a reward with partial credit (or --steps 0 "
            "to run without training)."
        )
    return LearningSignal(groups=groups, flat_groups=flat, task_reward_mean=mean, stalled=stalled)
