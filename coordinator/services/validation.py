"""Validation on the coordinator: validators ask for the reviews assigned to them and post verdicts.

A validator never picks its work: uploads, verdicts and each claim draw validators for waiting reviews
(:func:`coordinator.services.committee.assign`), and a claim hands the caller the reviews drawn for it.
An assignment is a lease: unanswered by its expiry, it is drawn again (a validator that dies
loses nothing). ``FOR UPDATE SKIP LOCKED`` keeps two coordinator replicas from drawing one review twice.

A verdict needs a live assignment and the validator's signature over it; the committee then
decides the submission or asks for another verdict, and credit or penalties follow the decision
(:mod:`coordinator.services.consequences`). An admin invalidating accepted work penalises the node
as a hard rejection does.
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime, timedelta
from typing import NamedTuple

from sqlalchemy import bindparam, or_, select, update
from sqlalchemy.orm import Session

from intellect_protocol.coordinator.errors import ApiError
from intellect_protocol.coordinator.models import Review, Run, Submission, Task
from intellect_protocol.coordinator.services import committee, consequences, credit, review_order, roles
from intellect_protocol.coordinator.services.independence import linked
from intellect_protocol.coordinator.services.rate_limit import RateLimiter
from intellect_protocol.coordinator.services.runs import require_stake, spec
from intellect_protocol.coordinator.settings import CoordinatorSettings
from intellect_protocol.shared.money import tokens
from intellect_protocol.shared.schemas import Claim, ClaimRequest, ErrorCode, RoleName, VerdictRequest
from intellect_protocol.shared.states import RunStatus, SubmissionStatus
from intellect_protocol.shared.verdicts import verdict_signer


class Drawn(NamedTuple):
    claims: list[Claim]
    """The caller's reviews, claimed by this look."""
    validators: set[str]
    """The validators this look drew waiting reviews for: their long polls look at once."""
    newcomers_in_s: float | None = None
    """Seconds until a newcomer's file waiting for the caller may be handed (``newcomer_reviews_per_s``); None:
    none was held back."""


def claim(
    session: Session,
    signer: str,
    body: ClaimRequest,
    settings: CoordinatorSettings,
    now: datetime,
    newcomers: RateLimiter,
    stake: int | None = None,
) -> Drawn:
    """Up to ``body.limit`` reviews assigned to ``signer`` that it has not fetched yet, oldest first.
    Validators stake like nodes: while an active run asks a minimum stake, a validator below it
    (``stake``, base units; None: unknown) is refused, so a revoked one has something to lose."""
    role = roles.require(session, signer, RoleName.validator)
    needed = max(
        (r.min_stake for r in session.scalars(select(Run).where(Run.status == RunStatus.active, Run.min_stake != 0))), default=0
    )
    if needed:
        require_stake(f"Validating while a run asks {tokens(needed)} tokens", signer, needed, stake)
    if role.last_seen is None or role.last_seen < now - timedelta(seconds=settings.committee.validator_live_s):
        # A validator back (or new) may be the one that reviews set aside were waiting for.
        session.execute(update(Review).where(Review.retry_at.is_not(None)).values(retry_at=None))
    role.last_seen = now
    session.flush()
    return draw(session, signer, body.limit, settings, now, newcomers)


# Built once: a long-polling validator runs it at every look.
_DRAWN = (
    select(Review, review_order.NEWCOMER, review_order.PROVEN)
    .join(Submission, Submission.id == Review.submission_id)
    .join(Task, Task.id == Submission.task_id)
    .where(
        Review.validator == bindparam("signer"),
        Review.outcome.is_(None),
        Review.voided_at.is_(None),
        Review.claimed_at.is_(None),
        Review.expires_at > bindparam("now"),
        or_(review_order.PROVEN, bindparam("unproven_allowed")),
    )
    .order_by(*review_order.URGENT_FIRST)
    .limit(bindparam("limit"))
)
_ON_UNPROVEN = (
    select(Review.validator, Review.claimed_at)
    .join(Submission, Submission.id == Review.submission_id)
    .where(
        Review.claimed_at.is_not(None),
        Review.outcome.is_(None),
        Review.voided_at.is_(None),
        Review.expires_at > bindparam("now"),
        ~review_order.PROVEN,
    )
)


def draw(
    session: Session, signer: str, limit: int, settings: CoordinatorSettings, now: datetime, newcomers: RateLimiter
) -> Drawn:
    """:func:`claim` after its checks: a long poll's later looks, within the request whose first look
    checked the signer's role and stake. A validator whose role is revoked meanwhile is drawn no new
    work, and can neither fetch what it was drawn before nor judge it (both check the role). A newcomer's
    file is handed only while ``newcomers`` has a turn for it."""
    assigned = committee.assign(session, settings, now)
    # Files of addresses with no accepted file are checked by a share of the validators at a time, one file a claim,
    # so a flood of fresh wallets' files (and their appeals) always leaves the others free for proven nodes' work.
    checking, most = unproven_checkers(session, settings, now)
    allowed = signer in checking or len(checking) < most
    params = {"signer": signer, "now": now, "limit": limit, "unproven_allowed": allowed, **review_order.order_params(now)}
    rows = session.execute(_DRAWN, params).all()
    unproven = [review for review, _, proven in rows if not proven][:1]
    drawn = [(review, newcomer) for review, newcomer, proven in rows if proven or review in unproven]
    chosen, held_back = _chosen(drawn), 0.0
    # A turn is taken only for a newcomer's file this claim hands out: none is spent while proven work fills it.
    if unproven and unproven[0] in chosen and (held_back := newcomers.acquire("reviews", now.timestamp())):
        chosen = _chosen([(review, newcomer) for review, newcomer in drawn if review is not unproven[0]])
    claims = []
    for review in chosen:
        review.claimed_at = now
        submission = session.get_one(Submission, review.submission_id)
        task, run = session.get_one(Task, submission.task_id), session.get_one(Run, submission.run_id)
        claims.append(
            Claim(
                submission_id=submission.id,
                sha256=submission.sha256,
                task=spec(run, task),
                # Freshness is the coordinator's call (stale work is expired before it is drawn), so an
                # audit, appeal or re-check of work that was fresh when first drawn is not judged late.
                oldest_step=min(task.policy_step, run.oldest_step),
                newest_step=run.policy_step,
                claim_expires_at=review.expires_at,
            )
        )
    return Drawn(claims, _may_take(assigned, checking, most), held_back or None)


def _chosen(drawn: list[tuple[Review, int]]) -> list[Review]:
    """The reviews a claim hands out of those ``drawn`` for it. Appeals and newcomers' files come last and one at a
    time: a validator never sits on a batch of them while a proven node's work waits, so a flood of them delays that
    work by one check at most."""
    batch = [review for review, newcomer in drawn if review.purpose != "appeal" and not newcomer]
    return batch or [review for review, _ in drawn[:1]]


def assign_arrived(session: Session, settings: CoordinatorSettings, now: datetime) -> set[str]:
    """Draw validators for the reviews waiting (work that just arrived); those whose long polls to wake."""
    assigned = committee.assign(session, settings, now)
    return _may_take(assigned, *unproven_checkers(session, settings, now)) if assigned else set()


def _may_take(assigned: dict[str, bool], checking: set[str], most: int) -> set[str]:
    """Of the validators ``assigned`` work, those that may take it now: a validator kept off newcomers' files is not
    woken for one (it looks again on its own timeout)."""
    return {v for v, proven in assigned.items() if proven or v in checking or len(checking) < most}


def unproven_checkers(session: Session, settings: CoordinatorSettings, now: datetime) -> tuple[set[str], int]:
    """The validators checking a file of an address with no accepted file, and how many may (``unproven_share`` of the
    live ones, at least one); a validator may be handed such a file if it is one of them or they are fewer. One is
    checking while it holds one such file unanswered, handed to it in the last :data:`~review_order.NEWCOMER_WAIT_S`:
    so one that sits on its file keeps the others off them for that long at most, one that hoards them keeps
    nobody off, and so does one no longer live."""
    held = session.execute(_ON_UNPROVEN, {"now": now}).all()
    files = Counter(validator for validator, _ in held)
    recent = now - timedelta(seconds=review_order.NEWCOMER_WAIT_S)
    live = committee.live_validators(session, settings, now)
    checking = {v for v, claimed_at in held if v in live and files[v] == 1 and claimed_at is not None and claimed_at > recent}
    return checking, max(1, int(len(live) * settings.committee.unproven_share))


def claimed(session: Session, signer: str, submission_id: str, now: datetime) -> tuple[Submission, Review]:
    """The submission and ``signer``'s live assignment to judge it, both locked: a revocation or a
    new draw running beside this verdict waits for it and then sees it given."""
    roles.require(session, signer, RoleName.validator)
    submission = session.get(Submission, submission_id, with_for_update=True)
    if submission is None:
        raise ApiError(ErrorCode.not_found, f"No submission {submission_id}.")
    review = session.scalar(
        select(Review)
        .where(
            Review.submission_id == submission_id,
            Review.validator == signer,
            Review.outcome.is_(None),
            Review.voided_at.is_(None),
            Review.expires_at > now,
        )
        .with_for_update()
    )
    if review is None:
        raise ApiError(
            ErrorCode.conflict,
            "You hold no live assignment to judge this submission (it was not drawn for you, or it expired).",
        )
    return submission, review


def record_verdict(
    session: Session, signer: str, body: VerdictRequest, settings: CoordinatorSettings, now: datetime, audience: str
) -> Submission:
    submission, review = claimed(session, signer, body.submission_id, now)
    if submission.address in linked(session, signer, settings):
        raise ApiError(ErrorCode.own_work, "A validator may not judge work of its own or of addresses linked to it.")
    try:
        verdict_by = verdict_signer(body.signature, audience, submission.id, submission.sha256, body.checks, body.untrained_rows)
    except ValueError:
        verdict_by = None
    if verdict_by != signer:
        raise ApiError(
            ErrorCode.body_signature_invalid,
            "The verdict's signature is not yours over this submission's file, checks and untrained rows.",
        )
    review.outcome = "accept" if body.accepted else "hard" if body.hard else "soft"
    review.checks = [c.model_dump() for c in body.checks]
    review.untrained_rows = sorted(set(body.untrained_rows)) or None
    review.signature = body.signature
    review.judged_at = now
    session.flush()
    committee.progress(session, submission, settings, now)
    return submission


def invalidate(session: Session, submission_id: str, reason: str, settings: CoordinatorSettings, now: datetime) -> Submission:
    """An admin's later finding that accepted work was invalid: its credit goes, and the node is penalised."""
    submission = session.get(Submission, submission_id)
    if submission is None:
        raise ApiError(ErrorCode.not_found, f"No submission {submission_id}.")
    if submission.status != SubmissionStatus.accepted:
        raise ApiError(ErrorCode.conflict, f"Only accepted submissions can be invalidated; this one is {submission.status}.")
    submission.status = SubmissionStatus.invalidated
    submission.reason = f"invalidated by an admin: {reason}"
    credit.claw_back(
        session, submission.address, submission.reason, now, cause=submission.id, only=submission.id, even_final=True
    )
    consequences.penalise(session, submission, submission.reason, settings, now)
    return submission
