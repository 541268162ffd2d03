"""What the trainer (role ``trainer``) reads and writes: accepted rollouts by cursor, step metrics.

The cursor is the id of the submission's first credit entry: assigned once, when its validators
accept it (after any audit), and increasing, so a trainer that remembers the last one it used
reads every accepted submission exactly once, across restarts. Rejected, pending or re-opened
work never appears.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, TypeVar

from sqlalchemy import Select, func, select
from sqlalchemy.orm import Session

from intellect_protocol.coordinator.errors import ApiError
from intellect_protocol.coordinator.models import ContributionEntry, Evaluation, Run, Submission, Task, TrainerMetrics
from intellect_protocol.coordinator.services import roles
from intellect_protocol.shared.schemas import AcceptedRollouts, ErrorCode, RoleName, TrainerMetricsRequest
from intellect_protocol.shared.states import EntryKind, SubmissionStatus

Rows = TypeVar("Rows", bound=Select[*tuple[Any, ...]])


def accepted_after(session: Session, signer: str, run_id: str, after: int, limit: int, now: datetime) -> list[AcceptedRollouts]:
    """Accepted submissions after ``after``; everything up to ``after`` counts as read (backpressure)."""
    roles.require(session, signer, RoleName.trainer).last_seen = now
    run = session.get(Run, run_id)
    if run is not None and after > run.trainer_cursor:
        run.trainer_cursor = after
    return accepted(session, run_id, after, limit)


def accepted(
    session: Session,
    run_id: str,
    after: int,
    limit: int,
    excluding: Select[int] | None = None,
    including: Select[int] | None = None,
) -> list[AcceptedRollouts]:
    """Up to ``limit`` accepted submissions of the run after cursor ``after``, in cursor order: not the
    cursors ``excluding`` selects, and only those ``including`` does."""
    query = _accepted(
        select(ContributionEntry.id, Submission.id, Submission.task_id, Task.policy_step, Submission.untrained_rows),
        run_id,
        after,
        excluding,
        including,
    )
    return [
        AcceptedRollouts(cursor=c, submission_id=s, task_id=t, policy_step=p, untrained_rows=u or [])
        for c, s, t, p, u in session.execute(query.order_by(ContributionEntry.id).limit(limit))
    ]


def count_accepted(session: Session, run_id: str, excluding: Select[int], at_most: int) -> int:
    """How many submissions :func:`accepted` would list without ``limit``, counted up to ``at_most``."""
    ids = _accepted(select(ContributionEntry.id), run_id, 0, excluding, None).limit(at_most).subquery()
    return session.scalar(select(func.count()).select_from(ids)) or 0


def _accepted(query: Rows, run_id: str, after: int, excluding: Select[int] | None, including: Select[int] | None) -> Rows:
    """``query`` of a run's accepted submissions after cursor ``after``, as :func:`accepted` selects them."""
    query = (
        query.join(Submission, Submission.id == ContributionEntry.submission_id)
        .join(Task, Task.id == Submission.task_id)
        .where(
            ContributionEntry.kind == EntryKind.credit,
            ContributionEntry.id > after,
            Submission.run_id == run_id,
            Submission.status == SubmissionStatus.accepted,
        )
    )
    if excluding is not None:
        query = query.where(ContributionEntry.id.not_in(excluding))
    if including is not None:
        query = query.where(ContributionEntry.id.in_(including))
    return query


def accepted_file_key(session: Session, signer: str, submission_id: str) -> str:
    roles.require(session, signer, RoleName.trainer)
    submission = session.get(Submission, submission_id)
    if submission is None or submission.status != SubmissionStatus.accepted:
        raise ApiError(ErrorCode.not_found, f"No accepted submission {submission_id}.")
    return submission.blob_key


def record_metrics(session: Session, signer: str, body: TrainerMetricsRequest, now: datetime) -> TrainerMetrics:
    roles.require(session, signer, RoleName.trainer)
    if session.get(Run, body.run_id) is None:
        raise ApiError(ErrorCode.not_found, f"No run {body.run_id}.")
    row = session.scalar(select(TrainerMetrics).where(TrainerMetrics.run_id == body.run_id, TrainerMetrics.step == body.step))
    if row is None:
        row = TrainerMetrics(run_id=body.run_id, step=body.step, metrics=body.metrics, created_at=now, cursor=body.cursor)
        session.add(row)
    else:
        row.metrics, row.cursor = body.metrics, body.cursor  # a restarted trainer reposting its step
    return row


def metrics_of(session: Session, run_id: str) -> list[TrainerMetrics]:
    return list(session.scalars(select(TrainerMetrics).where(TrainerMetrics.run_id == run_id).order_by(TrainerMetrics.step)))


def evaluations_of(session: Session, run_id: str) -> list[Evaluation]:
    return list(session.scalars(select(Evaluation).where(Evaluation.run_id == run_id).order_by(Evaluation.step)))


def run_stats(session: Session, run_id: str) -> dict[str, int]:
    """Submissions of a run by status, and the tokens of the accepted ones."""
    counts = dict(
        session.execute(
            select(Submission.status, func.count()).where(Submission.run_id == run_id).group_by(Submission.status)
        ).all()
    )
    tokens = session.scalar(
        select(func.coalesce(func.sum(Submission.tokens), 0)).where(
            Submission.run_id == run_id, Submission.status == SubmissionStatus.accepted
        )
    )
    return {**{s.value: counts.get(s, 0) for s in SubmissionStatus}, "accepted_tokens": int(tokens or 0)}
