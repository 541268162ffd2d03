"""Work that went stale before it was decided: its policy step fell out of the run's async window,
so the trainer could never use it. It expires: no credit, no penalty (the network made it late,
not the node), and no validator spends a model pass on it. Work a validator called forged is the
exception: it is judged to the end, or a forger would outwait its committee
(:mod:`coordinator.services.committee`)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import exists, select
from sqlalchemy.orm import Session

from intellect_protocol.coordinator.models import Review, Run, Submission, Task
from intellect_protocol.shared.states import SubmissionStatus

EXPIRED = "policy step {step} fell out of the run's window {oldest}..{newest} before its validators finished: expired, no credit, no penalty"


def stale(session: Session, submission: Submission) -> bool:
    """Whether ``submission``'s policy fell out of its run's window: the trainer could not use it."""
    task, run = session.get_one(Task, submission.task_id), session.get_one(Run, submission.run_id)
    return task.policy_step < run.oldest_step


def expire(session: Session, submission: Submission, now: datetime) -> None:
    """Decide undecided, stale ``submission`` as expired: the network, not the node, made it late,
    so no credit and no penalty; its open reviews are voided, so no validator spends a model pass on it."""
    task, run = session.get_one(Task, submission.task_id), session.get_one(Run, submission.run_id)
    for review in session.scalars(
        select(Review).where(Review.submission_id == submission.id, Review.outcome.is_(None), Review.voided_at.is_(None))
    ):
        review.voided_at, review.void_reason = now, "the work went stale first"
    submission.status, submission.outcome, submission.hard, submission.validated_at = SubmissionStatus.expired, "soft", False, now
    submission.reason = EXPIRED.format(step=task.policy_step, oldest=run.oldest_step, newest=run.policy_step)


# Built once: every validator's claim pass runs it, and building it cost more than running it (py-spy).
_STALE = (
    select(Submission)
    .join(Task, Task.id == Submission.task_id)
    .join(Run, Run.id == Submission.run_id)
    .where(
        Submission.status == SubmissionStatus.pending,
        Submission.outcome.is_(None),
        Task.policy_step < Run.oldest_step,
    )
    .where(~exists().where(Review.submission_id == Submission.id, Review.outcome == "hard", Review.voided_at.is_(None)))
    .with_for_update(skip_locked=True, of=Submission)
)


def expire_stale(session: Session, now: datetime) -> None:
    """:func:`expire` every undecided submission whose policy fell out of its run's window, unless a
    validator called it forged: that is judged to the end, or a forger would outwait its committee."""
    for submission in session.scalars(_STALE):
        expire(session, submission, now)
