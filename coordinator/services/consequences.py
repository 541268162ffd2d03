"""What a decision on a submission means for its node: credit, clawbacks and strikes, as new rows.

A decision can be revised: a tie-break, an appeal, a re-check after a validator lost its role.
:func:`apply` undoes what the previous outcome did and does what the new one asks, so balances
and strike counts always follow the latest decision while the ledger keeps every step.

- accept: credit (pending for the dispute window).
- hard (forged or corrupted work): no credit, the node's pending credit clawed back, a strike;
  ``max_strikes`` strikes ban the node. A node never credited for a file is struck up to ``max_strikes``
  at once: a fresh wallet's forgery costs it the wallet on its first file, not its third (sybils took two
  strikes each and walked away). Taking the strikes back below that lifts such a ban.
- soft: no credit; ``soft_rejections_per_strike`` of them within ``soft_rejection_window_s`` add a strike.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from intellect_protocol.coordinator.models import ContributionEntry, Node, NodeStrike, Submission
from intellect_protocol.coordinator.services import credit, nodes
from intellect_protocol.coordinator.settings import CoordinatorSettings
from intellect_protocol.shared.committee import Outcome
from intellect_protocol.shared.schemas import NodeStatus
from intellect_protocol.shared.states import EntryKind, SubmissionStatus


def apply(
    session: Session,
    submission: Submission,
    prev: Outcome | None,
    new: Outcome,
    settings: CoordinatorSettings,
    now: datetime,
    *,
    charge_soft: bool,
) -> None:
    """Move ``submission``'s node from what ``prev`` did to what ``new`` asks; ``charge_soft``: a
    new soft rejection counts towards a strike (not when numerics explain it or the work went stale)."""
    if prev == new:
        return
    why = f"{submission.id}: {submission.reason}"
    if prev == "accept":
        credit.claw_back(
            session,
            submission.address,
            f"no longer accepted: {why}",
            now,
            cause=submission.id,
            only=submission.id,
            even_final=True,
        )
    if prev == "hard":
        credit.restore(session, submission.id, f"rejection overturned: {submission.id}", now)
    if prev in ("hard", "soft"):
        take_back_strikes(session, submission, f"rejection overturned or softened: {submission.id}", settings, now)
    if new == "accept":
        credit.credit(session, submission, settings, now)
    elif new == "hard":
        penalise(session, submission, f"hard rejection of {why}", settings, now)
    elif charge_soft and prev is None:
        _charge_soft_rejection(session, submission, settings, now)


def penalise(session: Session, submission: Submission, reason: str, settings: CoordinatorSettings, now: datetime) -> None:
    """Claw back the node's pending credit and give it a strike (up to ``max_strikes`` at once, if it was
    never credited for a file), both caused by ``submission``."""
    credit.claw_back(session, submission.address, reason, now, cause=submission.id)
    credited = session.scalar(
        select(ContributionEntry.id)
        .where(ContributionEntry.address == submission.address, ContributionEntry.kind == EntryKind.credit)
        .limit(1)
    )
    node = session.get(Node, submission.address)
    units = 1 if credited is not None or node is None else max(1, settings.max_strikes - node.strikes)
    strike(session, submission.address, submission.id, reason, settings, now, units)


def strike(
    session: Session, address: str, submission_id: str, reason: str, settings: CoordinatorSettings, now: datetime, units: int = 1
) -> None:
    node = session.get(Node, address)
    if node is None:
        return
    session.add(NodeStrike(address=address, submission_id=submission_id, units=units, reason=reason, at=now))
    node.strikes += units
    if node.strikes >= settings.max_strikes and node.status != NodeStatus.banned:
        nodes.ban(session, address, f"{node.strikes} {nodes.STRIKES_BAN}", now)


def take_back_strikes(
    session: Session, submission: Submission, reason: str, settings: CoordinatorSettings, now: datetime
) -> None:
    """Remove the strikes ``submission`` caused, and lift a ban they alone had brought."""
    given = (
        session.scalar(select(func.coalesce(func.sum(NodeStrike.units), 0)).where(NodeStrike.submission_id == submission.id)) or 0
    )
    node = session.get(Node, submission.address)
    if given <= 0 or node is None:
        return
    session.add(NodeStrike(address=node.address, submission_id=submission.id, units=-given, reason=reason, at=now))
    node.strikes -= given
    if (
        node.status == NodeStatus.banned
        and (node.ban_reason or "").endswith(nodes.STRIKES_BAN)
        and node.strikes < settings.max_strikes
    ):
        nodes.unban(session, node.address, reason, now)


def _charge_soft_rejection(session: Session, submission: Submission, settings: CoordinatorSettings, now: datetime) -> None:
    since = now - timedelta(seconds=settings.soft_rejection_window_s)
    session.flush()
    count = session.scalar(
        select(func.count()).where(
            Submission.address == submission.address,
            Submission.status == SubmissionStatus.rejected,
            Submission.hard.is_not(True),
            Submission.validated_at >= since,
        )
    )
    if count and count % settings.soft_rejections_per_strike == 0:
        submission.reason = (
            f"{submission.reason}; a strike: {count} soft rejections within {settings.soft_rejection_window_s:.0f} s"
        )
        strike(session, submission.address, submission.id, submission.reason, settings, now)
