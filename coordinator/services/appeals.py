"""Appeals: a node asks validators that had not judged its rejected work to check it again.

One appeal per submission, only of a rejection, only within the run's dispute window of the
decision, and at most ``appeals_per_day`` per node. The appeal's committee (see
:mod:`coordinator.services.committee`) decides anew; its decision replaces the old one, and
credit and strikes follow as new ledger rows.

Appeals cost: one that fails (the rejection stands) is a strike against the node. An appeal
nobody could hear (every validator holding the role judged the work already, or is linked to the
node) is refused when filed, and nothing is recorded: it never waits in the queue. Appeals are
drawn for after all other work, so no number of them delays honest work's validation.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from intellect_protocol.coordinator.errors import ApiError
from intellect_protocol.coordinator.models import Appeal, Run, Submission
from intellect_protocol.coordinator.services import committee
from intellect_protocol.coordinator.settings import CoordinatorSettings
from intellect_protocol.shared.committee import AppealInfo, AppealRequest
from intellect_protocol.shared.schemas import ErrorCode
from intellect_protocol.shared.states import AppealStatus, SubmissionStatus

DAY = timedelta(days=1)


def file(session: Session, signer: str, body: AppealRequest, settings: CoordinatorSettings, now: datetime) -> AppealInfo:
    submission = session.get(Submission, body.submission_id, with_for_update=True)
    if submission is None:
        raise ApiError(ErrorCode.not_found, f"No submission {body.submission_id}.")
    if submission.address != signer:
        raise ApiError(ErrorCode.not_submitter, "Only the node that submitted this work may appeal it.")
    if submission.status != SubmissionStatus.rejected or submission.outcome not in ("soft", "hard"):
        raise ApiError(ErrorCode.conflict, f"Only rejected work can be appealed; this submission is {submission.status}.")
    if session.scalar(select(Appeal.id).where(Appeal.submission_id == submission.id)) is not None:
        raise ApiError(ErrorCode.conflict, "This submission was appealed already; see its receipt for the outcome.")
    run = session.get_one(Run, submission.run_id)
    window = settings.dispute_window_s if run.dispute_window_s is None else run.dispute_window_s
    if submission.validated_at is None:
        raise ApiError(ErrorCode.conflict, "This submission has no decision yet.")
    closes = submission.validated_at + timedelta(seconds=window)
    if now > closes:
        raise ApiError(ErrorCode.conflict, f"The dispute window of this decision closed at {closes.isoformat()}.")
    filed = session.scalar(select(func.count()).where(Appeal.address == signer, Appeal.created_at > now - DAY)) or 0
    if filed >= settings.committee.appeals_per_day:
        oldest = session.scalar(
            select(func.min(Appeal.created_at)).where(Appeal.address == signer, Appeal.created_at > now - DAY)
        )
        wait = max(1, int((oldest + DAY - now).total_seconds()))  # type: ignore[operator]
        raise ApiError(
            ErrorCode.rate_limited,
            f"At most {settings.committee.appeals_per_day} appeals a day; the next is possible in {wait} s.",
            headers={"Retry-After": str(wait)},
        )
    appeal = Appeal(
        submission_id=submission.id,
        address=signer,
        reason=body.reason,
        prior_outcome=submission.outcome,
        status=AppealStatus.open,
        created_at=now,
    )
    session.add(appeal)
    session.flush()
    committee.progress(session, submission, settings, now)
    heard_by = committee.open_reviews_of(session, [submission.id]).get(submission.id)
    if heard_by is None or not committee.could_be_judged(session, heard_by, settings):
        # The transaction rolls back: no appeal, no review.
        raise ApiError(
            ErrorCode.conflict,
            "No validator that has not judged this work holds the role, so nobody could hear this appeal; nothing was filed.",
        )
    return AppealInfo.model_validate(appeal, from_attributes=True)
