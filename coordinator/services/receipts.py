"""Receipts: everything about a submission that anyone (public) or an operator (admin) may see,
with every validator's signed verdict and its agreement rate."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from intellect_protocol.coordinator.errors import ApiError
from intellect_protocol.coordinator.models import Appeal, Review, Submission
from intellect_protocol.coordinator.services import accountability, credit
from intellect_protocol.coordinator.services.committee import open_reviews_of
from intellect_protocol.shared.committee import AdminReceipt, AppealInfo, PublicReceipt, VerdictRecord
from intellect_protocol.shared.schemas import CheckOutcome, ErrorCode
from intellect_protocol.shared.states import SubmissionStatus


def public_receipt(session: Session, submission_id: str) -> PublicReceipt:
    return _receipts(session, [_get(session, submission_id)])[0]


def receipts_of(session: Session, address: str, limit: int) -> list[PublicReceipt]:
    """The newest receipts of one node."""
    query = select(Submission).where(Submission.address == address).order_by(Submission.created_at.desc()).limit(limit)
    return _receipts(session, list(session.scalars(query)))


@dataclass(frozen=True)
class SubmissionFilter:
    run_id: str | None = None
    status: SubmissionStatus | None = None
    address: str | None = None
    since: datetime | None = None
    until: datetime | None = None


def admin_receipts(session: Session, where: SubmissionFilter, limit: int, offset: int) -> list[AdminReceipt]:
    """Submissions matching ``where``, newest first."""
    query = select(Submission).order_by(Submission.created_at.desc(), Submission.id)
    for column, value in (
        (Submission.run_id, where.run_id),
        (Submission.status, where.status),
        (Submission.address, where.address),
    ):
        if value is not None:
            query = query.where(column == value)
    if where.since is not None:
        query = query.where(Submission.created_at >= where.since)
    if where.until is not None:
        query = query.where(Submission.created_at < where.until)
    return _admin_receipts(session, list(session.scalars(query.limit(limit).offset(offset))))


def admin_receipt(session: Session, submission_id: str) -> AdminReceipt:
    return _admin_receipts(session, [_get(session, submission_id)])[0]


def _get(session: Session, submission_id: str) -> Submission:
    submission = session.get(Submission, submission_id)
    if submission is None:
        raise ApiError(ErrorCode.not_found, f"No submission {submission_id}.")
    return submission


def _admin_receipts(session: Session, submissions: list[Submission]) -> list[AdminReceipt]:
    open_reviews = open_reviews_of(session, [s.id for s in submissions])
    out = []
    for submission, public in zip(submissions, _receipts(session, submissions), strict=True):
        review = open_reviews.get(submission.id)
        held = review if review is not None and review.claimed_at is not None else None
        out.append(
            AdminReceipt(
                **public.model_dump(),
                blob_key=submission.blob_key,
                rows=submission.rows,
                tokens=submission.tokens,
                prompt_tokens=submission.prompt_tokens,
                claimed_by=held.validator if held else None,
                claim_expires_at=held.expires_at if held else None,
            )
        )
    return out


def _receipts(session: Session, submissions: list[Submission]) -> list[PublicReceipt]:
    """Receipts of ``submissions``, reading their verdicts, appeals and validators' agreement once for all."""
    ids = [s.id for s in submissions]
    reviews: dict[str, list[Review]] = defaultdict(list)
    for r in session.scalars(
        select(Review).where(Review.submission_id.in_(ids), Review.outcome.is_not(None)).order_by(Review.id)
    ):
        reviews[r.submission_id].append(r)
    appeals = {a.submission_id: a for a in session.scalars(select(Appeal).where(Appeal.submission_id.in_(ids)))}
    counts = accountability.agreement(session, {r.validator for rs in reviews.values() for r in rs if r.validator})
    credits = credit.net_units_of(session, ids)
    return [_receipt(s, reviews[s.id], appeals.get(s.id), counts, credits[s.id]) for s in submissions]


def _receipt(
    submission: Submission, reviews: list[Review], appeal: Appeal | None, counts: dict[str, tuple[int, int, int]], units: int
) -> PublicReceipt:
    verdicts = [
        VerdictRecord(
            validator=r.validator,
            purpose=r.purpose,
            outcome=r.outcome,
            checks=[CheckOutcome(**c) for c in r.checks or []],
            untrained_rows=r.untrained_rows or [],
            signature=r.signature or "",
            judged_at=r.judged_at,
            agreed=r.agreed,
            voided=r.voided_at is not None,
            agreement_rate=accountability.rate(*counts[r.validator][1:]),  # type: ignore[index]
        )
        for r in reviews
    ]
    return PublicReceipt(
        submission_id=submission.id,
        task_id=submission.task_id,
        run_id=submission.run_id,
        address=submission.address,
        status=submission.status,
        checks=submission.checks,
        reason=submission.reason,
        hard=submission.hard,
        credit=units,
        validator=submission.validator,
        created_at=submission.created_at,
        validated_at=submission.validated_at,
        untrained_rows=submission.untrained_rows or [],
        sha256=submission.sha256,
        verdict_signature=submission.verdict_signature,
        verdicts=verdicts,
        appeal=AppealInfo.model_validate(appeal, from_attributes=True) if appeal else None,
        held=submission.held_at is not None,
        trained_rows=submission.trained_rows,
    )
