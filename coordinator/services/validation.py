"""Validation on the coordinator: validators claim pending submissions and post verdicts.

A claim is a lease: a submission is claimed by one validator until the lease ends, when it
returns to the queue (a validator that dies loses nothing). ``FOR UPDATE SKIP LOCKED`` keeps
two coordinator replicas from handing one submission to two validators.

A verdict needs a live claim. Accepted: credit, pending for the dispute window. Rejected:
no credit; a hard rejection also claws back the node's pending credit, adds a strike, and
bans the node after ``max_strikes``. An admin invalidating accepted work has the same effects.
A soft rejection costs nothing alone, but every ``soft_rejections_per_strike`` of them within
``soft_rejection_window_s`` add a strike. A soft rejection of work whose policy step fell out of
the run's window before it was checked is recorded as *expired*: the network made it stale, so
it is no mark against the node.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session

from coordinator.errors import ApiError
from coordinator.models import Node, Run, Submission, Task
from coordinator.services import credit, nodes, roles
from coordinator.services.runs import spec
from coordinator.settings import CoordinatorSettings
from shared.schemas import (
    AdminReceipt,
    Claim,
    ClaimRequest,
    ErrorCode,
    NodeStatus,
    PublicReceipt,
    RoleName,
    VerdictRequest,
)
from shared.verdicts import verdict_signer


def linked(session: Session, address: str, settings: CoordinatorSettings) -> set[str]:
    """Addresses whose work ``address`` may not judge: itself, the nodes it operates, its operator
    and that operator's other nodes, and any group of ``settings.linked_addresses`` it is in."""
    node = session.get(Node, address)
    operators = {address} | ({node.operator_address} if node is not None and node.operator_address else set())
    out = operators | set(session.scalars(select(Node.address).where(Node.operator_address.in_(operators))))
    for group in settings.linked_addresses:
        if address in group:
            out |= set(group)
    return out


def claim(session: Session, signer: str, body: ClaimRequest, settings: CoordinatorSettings, now: datetime) -> list[Claim]:
    """Up to ``body.limit`` pending submissions for ``signer`` to check, never work of its own or of
    addresses linked to it."""
    roles.require(session, signer, RoleName.validator)
    query = (
        select(Submission)
        .where(Submission.status == "pending", or_(Submission.claimed_by.is_(None), Submission.claim_expires_at <= now))
        .where(Submission.address.not_in(linked(session, signer, settings)))
        .order_by(Submission.created_at)
        .limit(body.limit)
        .with_for_update(skip_locked=True)
    )
    claims = []
    for submission in session.scalars(query):
        submission.claimed_by = signer
        submission.claim_expires_at = now + timedelta(seconds=settings.validation_claim_s)
        task, run = session.get_one(Task, submission.task_id), session.get_one(Run, submission.run_id)
        claims.append(
            Claim(
                submission_id=submission.id,
                sha256=submission.sha256,
                task=spec(run, task),
                oldest_step=max(0, run.policy_step - run.async_level),
                newest_step=run.policy_step,
                claim_expires_at=submission.claim_expires_at,
            )
        )
    return claims


def claimed(session: Session, signer: str, submission_id: str, now: datetime) -> Submission:
    """The submission, if ``signer`` holds a live claim on it."""
    roles.require(session, signer, RoleName.validator)
    submission = session.get(Submission, submission_id)
    if submission is None:
        raise ApiError(404, ErrorCode.not_found, f"No submission {submission_id}.")
    if submission.status != "pending" or submission.claimed_by != signer or submission.claim_expires_at is None or submission.claim_expires_at <= now:
        raise ApiError(409, ErrorCode.conflict, "You hold no live claim on this submission (claim it first, or it expired).")
    return submission


def record_verdict(
    session: Session, signer: str, body: VerdictRequest, settings: CoordinatorSettings, now: datetime, audience: str
) -> Submission:
    submission = claimed(session, signer, body.submission_id, now)
    if submission.address in linked(session, signer, settings):
        raise ApiError(403, ErrorCode.own_work, "A validator may not judge work of its own or of addresses linked to it.")
    try:
        verdict_by = verdict_signer(body.signature, audience, submission.id, submission.sha256, body.checks, body.untrained_rows)
    except ValueError:
        verdict_by = None
    if verdict_by != signer:
        raise ApiError(422, ErrorCode.signature_invalid, "The verdict's signature is not yours over this submission's file, checks and untrained rows.")
    submission.verdict_signature = body.signature
    submission.status = "accepted" if body.accepted else "expired" if not body.hard and _stale(session, submission) else "rejected"
    submission.validator = signer
    submission.checks = [c.model_dump() for c in body.checks]
    submission.hard = body.hard
    submission.reason = "; ".join(
        f"{c.name}: {c.reason}" + (" (numerics explain it: no strike)" if c.explained else "") for c in body.checks if c.passed is False
    ) or "all checks passed"
    submission.validated_at = now
    submission.untrained_rows = sorted(set(body.untrained_rows)) if body.accepted and body.untrained_rows else None
    if body.accepted:
        credit.credit(session, submission, settings, now)
    elif body.hard:
        _penalise(session, submission.address, f"hard rejection of {submission.id}: {submission.reason}", settings, now)
    elif submission.status == "rejected" and not body.explained:
        _charge_soft_rejection(session, submission, settings, now)
    return submission


def _stale(session: Session, submission: Submission) -> bool:
    task, run = session.get_one(Task, submission.task_id), session.get_one(Run, submission.run_id)
    return task.policy_step < run.policy_step - run.async_level


def _charge_soft_rejection(session: Session, submission: Submission, settings: CoordinatorSettings, now: datetime) -> None:
    since = now - timedelta(seconds=settings.soft_rejection_window_s)
    session.flush()
    count = session.scalar(
        select(func.count()).where(
            Submission.address == submission.address, Submission.status == "rejected",
            Submission.hard.is_not(True), Submission.validated_at >= since,
        )
    )  # fmt: skip
    if count and count % settings.soft_rejections_per_strike == 0:
        submission.reason += f"; a strike: {count} soft rejections within {settings.soft_rejection_window_s:.0f} s"
        _strike(session, submission.address, settings, now)


def invalidate(session: Session, submission_id: str, reason: str, settings: CoordinatorSettings, now: datetime) -> Submission:
    """An admin's later finding that accepted work was invalid: its credit goes, and the node is penalised."""
    submission = session.get(Submission, submission_id)
    if submission is None:
        raise ApiError(404, ErrorCode.not_found, f"No submission {submission_id}.")
    if submission.status != "accepted":
        raise ApiError(409, ErrorCode.conflict, f"Only accepted submissions can be invalidated; this one is {submission.status}.")
    submission.status = "invalidated"
    submission.reason = f"invalidated by an admin: {reason}"
    credit.claw_back(session, submission.address, submission.reason, now, only=submission.id, even_final=True)
    _penalise(session, submission.address, submission.reason, settings, now)
    return submission


def _penalise(session: Session, address: str, reason: str, settings: CoordinatorSettings, now: datetime) -> None:
    credit.claw_back(session, address, reason, now)
    _strike(session, address, settings, now)


def _strike(session: Session, address: str, settings: CoordinatorSettings, now: datetime) -> None:
    node = session.get(Node, address)
    if node is None:
        return
    node.strikes += 1
    if node.strikes >= settings.max_strikes and node.status != NodeStatus.banned:
        nodes.ban(session, address, f"{node.strikes} strikes (forged or corrupted work, or repeated wrong work)", now)


def public_receipt(session: Session, submission_id: str) -> PublicReceipt:
    submission = session.get(Submission, submission_id)
    if submission is None:
        raise ApiError(404, ErrorCode.not_found, f"No submission {submission_id}.")
    return _receipt(session, submission)


def receipts_of(session: Session, address: str, limit: int) -> list[PublicReceipt]:
    """The newest receipts of one node."""
    query = select(Submission).where(Submission.address == address).order_by(Submission.created_at.desc()).limit(limit)
    return [_receipt(session, s) for s in session.scalars(query)]


@dataclass(frozen=True)
class SubmissionFilter:
    run_id: str | None = None
    status: str | None = None
    address: str | None = None
    since: datetime | None = None
    until: datetime | None = None


def admin_receipts(session: Session, where: SubmissionFilter, limit: int, offset: int) -> list[AdminReceipt]:
    """Submissions matching ``where``, newest first."""
    query = select(Submission).order_by(Submission.created_at.desc(), Submission.id)
    for column, value in ((Submission.run_id, where.run_id), (Submission.status, where.status), (Submission.address, where.address)):
        if value is not None:
            query = query.where(column == value)
    if where.since is not None:
        query = query.where(Submission.created_at >= where.since)
    if where.until is not None:
        query = query.where(Submission.created_at < where.until)
    return [_admin_receipt(session, s) for s in session.scalars(query.limit(limit).offset(offset))]


def admin_receipt(session: Session, submission_id: str) -> AdminReceipt:
    submission = session.get(Submission, submission_id)
    if submission is None:
        raise ApiError(404, ErrorCode.not_found, f"No submission {submission_id}.")
    return _admin_receipt(session, submission)


def _admin_receipt(session: Session, submission: Submission) -> AdminReceipt:
    return AdminReceipt(
        **_receipt(session, submission).model_dump(),
        blob_key=submission.blob_key, rows=submission.rows, tokens=submission.tokens,
        prompt_tokens=submission.prompt_tokens, claimed_by=submission.claimed_by, claim_expires_at=submission.claim_expires_at,
    )  # fmt: skip


def _receipt(session: Session, submission: Submission) -> PublicReceipt:
    return PublicReceipt(
        submission_id=submission.id,
        task_id=submission.task_id,
        run_id=submission.run_id,
        address=submission.address,
        status=submission.status,
        checks=submission.checks,  # type: ignore[arg-type]
        reason=submission.reason,
        hard=submission.hard,
        credit=credit.net_units(session, submission.id),
        validator=submission.validator,
        created_at=submission.created_at,
        validated_at=submission.validated_at,
        untrained_rows=submission.untrained_rows or [],
        sha256=submission.sha256,
        verdict_signature=submission.verdict_signature,
    )
