"""Validator committees: who judges a submission, and when its verdicts decide it.

Every submission gets a committee of reviews, each assigned by the coordinator to a validator
drawn at random among the *live* ones (seen within ``validator_live_s``) that may judge it: never
the node itself, nor an address linked to it, nor one linked to a validator that already judged it.
A validator cannot choose; an assignment not answered in ``validation_claim_s`` is drawn again.

How the verdicts decide (:func:`progress`):

1. One verdict. A hard rejection always gets a second opinion; any other verdict gets an audit
   with the run's audit chance (:class:`shared.run_schemas.AuditPolicy`). Else it decides.
2. Two verdicts that agree decide; two that disagree go to a third validator.
3. Three verdicts: the majority stands (accepted if most accept, hard if most say forged, else soft).

Validators on the losing side are outvoted (:mod:`coordinator.services.accountability`). When no
validator holding the role could judge independently, an audit or second opinion is waived and the
receipt says so; a *split* is never decided that way: the submission is **held** (out of training,
credit and the run's backlog, nobody struck) until an independent third validator holds the role.
When validators who could judge are not live, the review waits for them. Work some validator
called forged is judged to the end even after it went stale, so a forger cannot outwait its
committee. A node's appeal gets a new committee of validators that had not judged the work,
decided the same way (at least two verdicts), and its decision replaces the old one; an appeal
that nobody eligible could hear is refused when filed (:mod:`coordinator.services.appeals`).

Drawing never starves: appeals are drawn for after every other review, and a review nobody could
be drawn for is set aside for ``unassignable_retry_s``, so it never fills the scan of waiting work.

A node that any validator called forged (or that has a strike) is audited at the run's suspect
share. When a validator is outvoted, every acceptance it decided alone that the trainer has not
read yet is withheld and audited; when it loses its role, its recent verdicts are voided and the
submissions they decided are judged again. Accepted work reversed after the trainer read it is
counted (:attr:`Submission.trained_rows`) against the validators that approved it.
"""

from __future__ import annotations

import secrets
from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime, timedelta

from sqlalchemy import bindparam, func, or_, select
from sqlalchemy.orm import Session

from intellect_protocol.coordinator.models import Appeal, ContributionEntry, Review, Role, Run, Submission, Task
from intellect_protocol.coordinator.services import accountability, consequences, roles
from intellect_protocol.coordinator.services.decisions import Decision, appeal_result, decision, majority, outvoted
from intellect_protocol.coordinator.services.independence import linked
from intellect_protocol.coordinator.services.review_order import PROVEN, URGENT_FIRST, order_params
from intellect_protocol.coordinator.services.staleness import expire, expire_stale, stale
from intellect_protocol.coordinator.settings import CoordinatorSettings
from intellect_protocol.shared.committee import Outcome, Purpose
from intellect_protocol.shared.run_schemas import AuditPolicy
from intellect_protocol.shared.schemas import RoleName
from intellect_protocol.shared.states import AppealStatus, EntryKind, SubmissionStatus

ASSIGN_SCAN = 256
"""Most waiting reviews drawn for at each claim: bounds one claim's work whatever the backlog."""


def open_review(
    session: Session, submission: Submission, purpose: Purpose, now: datetime, appeal: Appeal | None = None
) -> Review:
    review = Review(submission_id=submission.id, purpose=purpose, appeal_id=appeal.id if appeal else None, opened_at=now)
    session.add(review)
    return review


# Built once with their times as parameters: every validator's claim pass runs them.
_LIVE = select(Role.address).where(
    Role.role == RoleName.validator, Role.revoked_at.is_(None), Role.last_seen >= bindparam("seen")
)
_WAITING = (
    select(Review, PROVEN)
    .join(Submission, Submission.id == Review.submission_id)
    .join(Task, Task.id == Submission.task_id)
    .where(
        Review.outcome.is_(None),
        Review.voided_at.is_(None),
        or_(Review.validator.is_(None), Review.expires_at <= bindparam("now")),
    )
    .where(or_(Review.retry_at.is_(None), Review.retry_at <= bindparam("now")))
    .order_by(*URGENT_FIRST)
    .limit(ASSIGN_SCAN)
    .with_for_update(skip_locked=True, of=Review)
)


def live_validators(session: Session, settings: CoordinatorSettings, now: datetime) -> list[str]:
    """Validators holding the role that asked for work within ``validator_live_s``."""
    return list(session.scalars(_LIVE, {"seen": now - timedelta(seconds=settings.committee.validator_live_s)}))


def assign(session: Session, settings: CoordinatorSettings, now: datetime) -> dict[str, bool]:
    """Draw a live, eligible validator for every review waiting for one (unassigned, or its
    assignment lapsed), the work closest to going stale first; expire what went stale waiting.
    The validators drawn, each with whether any of its new work is of a node with an accepted file."""
    expire_stale(session, now)
    live = live_validators(session, settings, now)
    if not live:
        return {}
    waiting = session.execute(_WAITING, {"now": now, **order_params(now)}).all()
    if not waiting:
        return {}
    links = {v: linked(session, v, settings) for v in live}
    drawn: dict[str, bool] = {}
    for review, proven in waiting:
        candidates = _independent(session, review, live, links)
        if candidates:
            review.validator = secrets.choice(candidates)
            drawn[review.validator] = drawn.get(review.validator, False) or bool(proven)
            review.expires_at = now + timedelta(seconds=settings.committee.validation_claim_s)
            review.claimed_at = review.retry_at = None
        else:
            review.validator = review.expires_at = review.claimed_at = None
            review.retry_at = now + timedelta(seconds=settings.committee.unassignable_retry_s)
    return drawn


def _independent(session: Session, review: Review, validators: Sequence[str], links: dict[str, set[str]]) -> list[str]:
    """Those of ``validators`` that may judge ``review``'s submission."""
    submission = session.get_one(Submission, review.submission_id)
    others = session.scalars(select(Review.validator).where(Review.submission_id == review.submission_id, Review.id != review.id))
    barred = {submission.address} | {v for v in others if v is not None}
    return [v for v in validators if not links[v] & barred]


def could_be_judged(session: Session, review: Review, settings: CoordinatorSettings) -> bool:
    """Whether any validator holding the role, live or not, may judge ``review``'s submission."""
    holders = roles.holders(session, RoleName.validator)
    return bool(_independent(session, review, holders, {v: linked(session, v, settings) for v in holders}))


def progress(session: Session, submission: Submission, settings: CoordinatorSettings, now: datetime) -> None:
    """After a verdict, a new appeal or a voided verdict: open the review ``submission`` needs next, or decide it.

    Once a submission was appealed, the appeal's committee is the one that counts."""
    appeal = session.scalar(select(Appeal).where(Appeal.submission_id == submission.id))
    reviews = [
        r
        for r in session.scalars(select(Review).where(Review.submission_id == submission.id).order_by(Review.id))
        if r.voided_at is None and r.appeal_id == (appeal.id if appeal else None)
    ]
    if (
        appeal is None
        and submission.outcome is None
        and stale(session, submission)
        and not any(r.outcome == "hard" for r in reviews)
    ):
        return expire(session, submission, now)
    if any(r.outcome is None for r in reviews):
        return
    outcomes: list[Outcome] = [r.outcome for r in reviews]  # type: ignore[misc]
    if not reviews:
        open_review(session, submission, "appeal" if appeal else "recheck" if submission.outcome else "first", now, appeal)
        return
    if len(reviews) == 1:
        extra = _second_look(session, submission, reviews[0], appeal)
        if extra is None:
            return _decide(session, submission, outcomes[0], reviews, appeal, settings, now)
        if _open_if_judgeable(session, submission, extra, now, appeal, settings):
            return None
        return _decide(
            session,
            submission,
            outcomes[0],
            reviews,
            appeal,
            settings,
            now,
            f"{extra.replace('_', ' ')} waived: no independent validator holds the role",
        )
    if len(reviews) == 2 and outcomes[0] != outcomes[1]:
        if not _open_if_judgeable(session, submission, "appeal" if appeal else "tiebreak", now, appeal, settings):
            _hold(session, submission, outcomes, appeal, now)
        return None
    return _decide(session, submission, majority(outcomes), reviews, appeal, settings, now)


HELD = "held: its validators split ({split}) and no independent third validator holds the role; out of training and credit, nobody struck, until one does"


def _hold(session: Session, submission: Submission, outcomes: list[Outcome], appeal: Appeal | None, now: datetime) -> None:
    """A split nobody independent can break: never decided on a thin committee (either side could be
    the liar), so the tie-break waits, drawn for as soon as an independent validator holds the role."""
    open_review(session, submission, "appeal" if appeal else "tiebreak", now, appeal)
    submission.held_at = submission.held_at or now
    if appeal is None:
        submission.status = SubmissionStatus.pending
        submission.reason = HELD.format(split=", ".join(outcomes))


def _second_look(session: Session, submission: Submission, only: Review, appeal: Appeal | None) -> Purpose | None:
    if appeal is not None:
        return "appeal"
    if only.outcome == "hard":
        return "second_opinion"
    return "audit" if secrets.SystemRandom().random() < audit_chance(session, submission, only.validator) else None  # type: ignore[arg-type]


def audit_chance(session: Session, submission: Submission, validator: str) -> float:
    """The highest audit share of the run's policy that applies to this node and this validator."""
    policy = AuditPolicy.model_validate(session.get_one(Run, submission.run_id).audit or {})
    chance = policy.share
    accepted = (
        session.scalar(
            select(func.count()).where(Submission.address == submission.address, Submission.status == SubmissionStatus.accepted)
        )
        or 0
    )
    if accepted < policy.new_node_accepted:
        chance = max(chance, policy.new_node_share)
    if accountability.suspect_node(session, submission.address):
        chance = max(chance, policy.suspect_share)
    if accountability.suspect(session, validator, policy.new_validator_verdicts):
        chance = max(chance, policy.suspect_share)
    return chance


def _rows_trained(session: Session, submission: Submission) -> int:
    """Rows of accepted ``submission`` the trainer has read: all it trains on, if its cursor passed the credit."""
    cursor = session.get_one(Run, submission.run_id).trainer_cursor
    first = session.scalar(
        select(func.min(ContributionEntry.id)).where(
            ContributionEntry.submission_id == submission.id, ContributionEntry.kind == EntryKind.credit
        )
    )
    if first is None or first > cursor:
        return 0
    return submission.rows - len(submission.untrained_rows or [])


def _open_if_judgeable(
    session: Session,
    submission: Submission,
    purpose: Purpose,
    now: datetime,
    appeal: Appeal | None,
    settings: CoordinatorSettings,
) -> bool:
    review = open_review(session, submission, purpose, now, appeal)
    session.flush()
    if could_be_judged(session, review, settings):
        return True
    session.delete(review)
    return False


def _decide(
    session: Session,
    submission: Submission,
    outcome: Outcome,
    reviews: list[Review],
    appeal: Appeal | None,
    settings: CoordinatorSettings,
    now: datetime,
    note: str | None = None,
) -> None:
    """Decide ``submission`` as ``outcome``: record it, move the node's credit and strikes, settle an open
    appeal, and strike the validators the decision outvoted."""
    prev: Outcome | None = submission.outcome  # type: ignore[assignment]
    decided = decision(outcome, reviews, note)
    _record(submission, outcome, decided, now)
    consequences.apply(session, submission, prev, outcome, settings, now, charge_soft=decided.charge_soft)
    judged = list(reviews)
    if appeal is not None and appeal.status == AppealStatus.open:
        judged += _settle_appeal(session, submission, appeal, outcome, settings, now)
    _judge_validators(session, submission, judged, outcome, appeal, settings, now)


def _record(submission: Submission, outcome: Outcome, decided: Decision, now: datetime) -> None:
    if outcome == "accept":
        submission.trained_rows = None  # counted only where an acceptance is reversed (set by reopen)
    submission.held_at = None
    submission.status = SubmissionStatus.accepted if outcome == "accept" else SubmissionStatus.rejected
    submission.outcome = outcome
    submission.hard = outcome == "hard"
    submission.validated_at = now
    lead = decided.lead
    submission.validator, submission.checks, submission.verdict_signature = lead.validator, lead.checks, lead.signature
    submission.untrained_rows = decided.untrained_rows
    submission.reason = decided.reason


def _settle_appeal(
    session: Session, submission: Submission, appeal: Appeal, outcome: Outcome, settings: CoordinatorSettings, now: datetime
) -> list[Review]:
    """Close ``appeal`` as upheld (the rejection stands: the node pays for the validators' passes with a
    strike) or overturned; returns the first committee's verdicts, which the appeal's decision judges too."""
    appeal.status = appeal_result(appeal.prior_outcome, outcome)  # type: ignore[arg-type]
    appeal.decided_at = now
    if appeal.status == AppealStatus.upheld:
        why = f"appeal of {submission.id} failed: the rejection stands"
        consequences.strike(session, submission.address, submission.id, why, settings, now)
    first = select(Review).where(Review.submission_id == submission.id, Review.appeal_id.is_(None))
    return [r for r in session.scalars(first) if r.voided_at is None and r.outcome is not None]


def _judge_validators(
    session: Session,
    submission: Submission,
    judged: list[Review],
    outcome: Outcome,
    appeal: Appeal | None,
    settings: CoordinatorSettings,
    now: datetime,
) -> None:
    """Mark who agreed with ``outcome`` and strike who did not: a struck validator's lone approvals are
    withheld, a revoked one's recent verdicts are judged again."""
    losers = outvoted(judged, outcome, appeal.id if appeal else None)
    if len(judged) >= 2:
        for review in judged:
            review.agreed = review.outcome == outcome
    for validator, why in losers:
        struck = accountability.strike(session, validator, submission.id, why, settings, now)
        if struck == "revoked":
            recheck_verdicts_of(session, validator, settings, now)
        elif struck == "struck":
            withhold_approvals_of(session, validator, now)


def release_assignments(session: Session, validator: str) -> None:
    """``validator``'s open assignments are drawn again at once (it lost its role), not left to lapse."""
    # Locked: a verdict being given on one of them finishes first and is then no longer open.
    open_ones = (
        select(Review)
        .where(Review.validator == validator, Review.outcome.is_(None), Review.voided_at.is_(None))
        .with_for_update()
    )
    for review in session.scalars(open_ones):
        review.validator = review.expires_at = review.claimed_at = None


def recheck_verdicts_of(session: Session, validator: str, settings: CoordinatorSettings, now: datetime) -> None:
    """After ``validator`` lost its role: its open assignments are drawn again, its verdicts of the
    last ``recheck_window_s`` stop counting, and every submission one of them helped decide is judged again."""
    release_assignments(session, validator)
    since = now - timedelta(seconds=settings.committee.recheck_window_s)
    voided: dict[str, list[Review]] = defaultdict(list)
    query = select(Review).where(
        Review.validator == validator, Review.outcome.is_not(None), Review.voided_at.is_(None), Review.judged_at >= since
    )
    for review in session.scalars(query):
        review.voided_at, review.void_reason = now, "its validator lost the role"
        voided[review.submission_id].append(review)
    session.flush()
    for submission_id, reviews in voided.items():
        submission = session.get_one(Submission, submission_id, with_for_update=True)
        if submission.status == SubmissionStatus.invalidated:
            continue
        if submission.status != SubmissionStatus.pending:
            if not any(r.outcome == submission.outcome for r in reviews):
                continue  # it was outvoted there: the decision stands without it
            reopen(session, submission)
        progress(session, submission, settings, now)


def reopen(session: Session, submission: Submission) -> None:
    """Take decided ``submission`` back to pending (out of the trainer's reads until decided again),
    noting how many of its rows the trainer had read already: they count if the acceptance falls."""
    if submission.outcome == "accept" and submission.status == SubmissionStatus.accepted:
        submission.trained_rows = _rows_trained(session, submission)
    submission.status = SubmissionStatus.pending


def withhold_approvals_of(session: Session, validator: str, now: datetime) -> None:
    """After ``validator`` was outvoted: every acceptance it decided alone (nobody else judged it)
    that the trainer has not read yet goes back to pending with an audit, so what a caught rogue
    waved through reaches the trainer only if an independent validator agrees."""
    alone = (
        select(Submission)
        .join(Review, Review.submission_id == Submission.id)
        .join(Run, Run.id == Submission.run_id)
        .join(
            ContributionEntry, (ContributionEntry.submission_id == Submission.id) & (ContributionEntry.kind == EntryKind.credit)
        )
        .where(Review.validator == validator, Review.outcome == "accept", Review.agreed.is_(None), Review.voided_at.is_(None))
        .where(
            Submission.status == SubmissionStatus.accepted,
            Submission.validator == validator,
            ContributionEntry.id > Run.trainer_cursor,
        )
        .with_for_update(of=Submission)
    )
    for submission in session.scalars(alone).unique():
        reopen(session, submission)
        submission.reason = f"withheld from training: its only validator {validator} was outvoted elsewhere; an audit decides"
        open_review(session, submission, "audit", now)


def open_reviews_of(session: Session, submission_ids: list[str]) -> dict[str, Review]:
    """Per submission, the review now waiting for a verdict (those that have one), in one query."""
    query = select(Review).where(Review.submission_id.in_(submission_ids), Review.outcome.is_(None), Review.voided_at.is_(None))
    return {r.submission_id: r for r in session.scalars(query)}
