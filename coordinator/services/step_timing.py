"""Where a run's wall clock goes, policy step by policy step (:class:`shared.run_schemas.StepTiming`).

Only the coordinator's clock is read: a task's lease, an upload's first byte, its recording, its
acceptance (the credit entry the trainer's cursor counts), an expiry, and each manifest's
registration. The trainer contributes only which accepted work each step read (its cursor).
"""

from __future__ import annotations

import bisect
import statistics
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from intellect_protocol.coordinator.models import ContributionEntry, Submission, Task, TrainerMetrics
from intellect_protocol.coordinator.services import runs
from intellect_protocol.coordinator.shardcast_models import PolicyManifest
from intellect_protocol.shared.run_schemas import StepTiming
from intellect_protocol.shared.states import EntryKind, SubmissionStatus


def step_timings(session: Session, run_id: str, limit: int = 200) -> list[StepTiming]:
    """The last ``limit`` published steps whose trainer reported its cursor, oldest first."""
    run = runs.get_run(session, run_id)
    # Only the newest steps are read, so the trainer's per-step report costs the same at step 10 and 10,000.
    reported = session.execute(
        select(TrainerMetrics.step, TrainerMetrics.cursor, TrainerMetrics.metrics)
        .where(TrainerMetrics.run_id == run_id, TrainerMetrics.cursor.is_not(None))
        .order_by(TrainerMetrics.step.desc())
        .limit(limit + 1)
    ).all()
    cursors: dict[int, int] = {0: 0} | {step: cursor for step, cursor, _ in reported}
    stale: dict[int, float | None] = {step: metrics.get("dropped_stale") for step, _, metrics in reported}
    oldest = min((step for step, _, _ in reported), default=1) - 1
    published = dict(
        session.execute(
            select(PolicyManifest.step, PolicyManifest.created_at).where(
                PolicyManifest.run_id == run_id, PolicyManifest.step >= oldest
            )
        ).all()
    )
    steps = sorted(s for s in cursors if s in published and s - 1 in cursors)[-limit:]
    if not steps:
        return []
    started = run.created_at
    if steps[0] == 1:
        started = session.scalar(select(func.min(Task.leased_at)).where(Task.run_id == run_id)) or started

    # Every accepted submission the listed steps read, in cursor order, in one query.
    low, high = cursors[steps[0] - 1], cursors[steps[-1]]
    read = session.execute(
        select(
            ContributionEntry.id,
            ContributionEntry.created_at,
            Submission.created_at,
            Submission.upload_started_at,
            Task.leased_at,
        )
        .join(Submission, Submission.id == ContributionEntry.submission_id)
        .join(Task, Task.id == Submission.task_id)
        .where(
            ContributionEntry.kind == EntryKind.credit,
            Submission.run_id == run_id,
            ContributionEntry.id > low,
            ContributionEntry.id <= high,
        )
        .order_by(ContributionEntry.id)
    ).all()
    ids = [row[0] for row in read]
    since = published.get(steps[0] - 1, started)
    expired = session.execute(
        select(Submission.validated_at, Submission.tokens)
        .where(Submission.run_id == run_id, Submission.status == SubmissionStatus.expired, Submission.validated_at > since)
        .order_by(Submission.validated_at)
    ).all()
    expired_at = [at for at, _ in expired if at is not None]

    timings = []
    for step in steps:
        begin, end = published.get(step - 1, started), published[step]
        used = read[bisect.bisect_right(ids, cursors[step - 1]) : bisect.bisect_right(ids, cursors[step])]
        ready = max((accepted for _, accepted, *_ in used), default=begin)
        wait = _seconds(begin, min(max(ready, begin), end))
        gone = expired[bisect.bisect_right(expired_at, begin) : bisect.bisect_right(expired_at, end)]
        timings.append(
            StepTiming(
                step=step,
                interval_s=_seconds(begin, end),
                node_s=_mean([(leased, upload) for *_, upload, leased in used]),
                upload_s=_mean([(upload, recorded) for _, _, recorded, upload, _ in used]),
                validation_s=_mean([(recorded, accepted) for _, accepted, recorded, *_ in used]),
                trainer_wait_s=wait,
                training_s=_seconds(begin, end) - wait,
                submissions=len(used),
                expired=len(gone),
                expired_tokens=sum(tokens for _, tokens in gone),
                dropped_stale=stale.get(step),
            )
        )
    return timings


def _seconds(start: datetime, end: datetime) -> float:
    return max(0.0, (end - start).total_seconds())


def _mean(spans: list[tuple[datetime | None, datetime | None]]) -> float | None:
    """Mean length of the spans whose ends are both known (work recorded before step timing has none)."""
    known = [_seconds(a, b) for a, b in spans if a is not None and b is not None]
    return statistics.fmean(known) if known else None
