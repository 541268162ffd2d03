"""Whether a run hands out new work now, and if not, why: backpressure from measured throughput.

A rollout is worth generating only if its validators decide it, and the trainer reads it, before
the run's policy moves ``async_level`` steps past the step it was made with. So new tasks are
handed out only while the work ahead of them clears in half that *horizon*:

- validation: submissions awaiting verdicts plus tasks in progress, at most the run's measured
  decision rate (decided submissions per second over ``throughput_window_s``) times half the
  horizon;
- training: accepted submissions the trainer has not read yet, at most the same.

The horizon is ``async_level`` (at least one) times the measured time between the trainer's last
policy steps, or ``backpressure_horizon_s`` before two steps were published. Whatever is measured,
``backlog_floor`` items may always wait (so a run starts, and a slow start is not starved), and
never more than ``max_validation_backlog``.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from intellect_protocol.coordinator.models import ContributionEntry, Role, Run, Submission, Task
from intellect_protocol.coordinator.settings import CoordinatorSettings
from intellect_protocol.coordinator.shardcast_models import PolicyManifest
from intellect_protocol.shared.schemas import RoleName, WorkWait
from intellect_protocol.shared.states import EntryKind, RunStatus, SubmissionStatus, TaskStatus

NO_RUN = WorkWait(
    reason="no_run",
    message="this coordinator has no RL run yet (nodes have no part in pretraining runs); its operator creates one",
    retry_after_s=30,
)

STEPS_MEASURED = 5
"""Policy steps whose spacing gives the step period."""
TRAINER_RETRY_S = 1.0
"""When a node waiting for the trainer asks again: a trainer reads a policy step's worth at once."""


def work_wait(session: Session, run: Run, settings: CoordinatorSettings, now: datetime) -> WorkWait | None:
    """Why ``run`` hands out no new task now (None: it does)."""
    if run.status != RunStatus.active:
        return paused(run)
    horizon = _horizon(session, run, settings)
    rate = decision_rate(session, run.id, settings, now)
    allowed = min(settings.admission.max_validation_backlog, max(settings.admission.backlog_floor, int(rate * horizon / 2)))
    queued = backlog(session, run.id, now)
    if queued >= allowed:
        if not _live(session, RoleName.validator, now - timedelta(seconds=settings.committee.validator_live_s)):
            message = (
                f"no validator has asked for work in {settings.committee.validator_live_s:.0f} s; {queued} files wait for one"
            )
            return WorkWait(reason="no_validator", message=message, retry_after_s=30)
        message = (
            f"waiting for validation capacity: {queued} files are queued or in progress, as many as validators "
            f"decide ({rate * 60:.0f} a minute) before work goes stale ({horizon:.0f} s)"
        )
        return WorkWait(
            reason="validation_capacity", message=message, retry_after_s=max(1.0, min(10.0, 1 / rate if rate else 10.0))
        )
    unread = unread_by_trainer(session, run)
    if unread >= allowed:
        if not _live(session, RoleName.trainer, now - timedelta(seconds=settings.admission.trainer_live_s)):
            message = f"no trainer has read this run's work in {settings.admission.trainer_live_s:.0f} s; {unread} accepted files wait for one"
            return WorkWait(reason="no_trainer", message=message, retry_after_s=30)
        message = f"waiting for the trainer: {unread} accepted files are not read yet"
        return WorkWait(reason="trainer_capacity", message=message, retry_after_s=TRAINER_RETRY_S)
    return None


def paused(run: Run) -> WorkWait:
    said = f"run {run.name}: {run.paused_reason}" if run.paused_reason else f"run {run.name} is paused by its operator"
    return WorkWait(reason="paused", message=said, retry_after_s=30)


def backlog(session: Session, run_id: str, now: datetime) -> int:
    """Submissions awaiting a decision plus tasks being worked on: what validators will have to check
    (held splits wait for a validator that does not exist yet, not for capacity: they do not count)."""
    pending = session.scalar(
        select(func.count())
        .select_from(Submission)
        .where(Submission.run_id == run_id, Submission.status == SubmissionStatus.pending, Submission.held_at.is_(None))
    )
    working = session.scalar(
        select(func.count())
        .select_from(Task)
        .where(Task.run_id == run_id, Task.status == TaskStatus.leased, Task.lease_expires_at > now)
    )
    return (pending or 0) + (working or 0)


def decision_rate(session: Session, run_id: str, settings: CoordinatorSettings, now: datetime) -> float:
    """Submissions of ``run_id`` decided per second, over the last ``throughput_window_s`` (0 before three)."""
    since = now - timedelta(seconds=settings.admission.throughput_window_s)
    count, first = session.execute(
        select(func.count(), func.min(Submission.validated_at)).where(
            Submission.run_id == run_id, Submission.validated_at >= since
        )
    ).one()
    if count < 3 or first is None:
        return 0.0
    span = max((now - first).total_seconds(), 1.0)
    return count / span


def unread_by_trainer(session: Session, run: Run) -> int:
    """Accepted submissions after the trainer's last read cursor."""
    query = (
        select(func.count())
        .select_from(ContributionEntry)
        .join(Submission, Submission.id == ContributionEntry.submission_id)
        .where(ContributionEntry.kind == EntryKind.credit, ContributionEntry.id > run.trainer_cursor, Submission.run_id == run.id)
        .where(Submission.status == SubmissionStatus.accepted)
    )
    return session.scalar(query) or 0


def _horizon(session: Session, run: Run, settings: CoordinatorSettings) -> float:
    """Seconds until work leased now goes stale, by the run's measured step period."""
    published = func.min(PolicyManifest.created_at)  # a restarted trainer registers its step again
    times = list(
        session.scalars(
            select(published)
            .where(PolicyManifest.run_id == run.id)
            .group_by(PolicyManifest.step)
            .order_by(PolicyManifest.step.desc())
            .limit(STEPS_MEASURED)
        )
    )
    if len(times) < 2:
        return settings.admission.backpressure_horizon_s
    period = (times[0] - times[-1]).total_seconds() / (len(times) - 1)
    return max(run.async_level, 1) * max(period, 1.0)


def _live(session: Session, role: RoleName, since: datetime) -> bool:
    query = select(Role.id).where(Role.role == role, Role.revoked_at.is_(None), Role.last_seen >= since).limit(1)
    return session.scalar(query) is not None
