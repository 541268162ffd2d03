"""Contribution credit: an append-only ledger of entries, pending until the dispute window ends.

Accepted work earns a credit entry (generated tokens plus weighted prompt tokens). A hard
rejection, or an admin invalidating accepted work, appends negative clawback entries for the
node's credit that is still pending, each naming the submission that caused it; if that
rejection is overturned, restore entries give the credit back. Balances are sums of entries,
nothing else.

Credit a closed settlement epoch counts is never clawed back: its root may be on chain already,
and a clawback after it would stay claimable there until the next root. A later finding against
such work still strikes (and so bans and slashes) the node; only the credit stays.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import case, func, select
from sqlalchemy.orm import Session

from intellect_protocol.coordinator.models import ContributionEntry, Run, Submission
from intellect_protocol.coordinator.settings import CoordinatorSettings
from intellect_protocol.coordinator.settlement_models import Epoch
from intellect_protocol.shared.money import credit_of
from intellect_protocol.shared.states import EntryKind


def credit(session: Session, submission: Submission, settings: CoordinatorSettings, now: datetime) -> ContributionEntry | None:
    """Credit for accepted work, unless it holds its credit already. Work accepted again after a
    reversal gets a *restore* entry: only first credits reach the trainer, which may have read it."""
    if net_units(session, submission.id) > 0:
        return None
    before = session.scalar(
        select(ContributionEntry.id)
        .where(ContributionEntry.submission_id == submission.id, ContributionEntry.kind == EntryKind.credit)
        .limit(1)
    )
    units = credit_of(submission.tokens, submission.prompt_tokens, settings.prompt_token_weight)
    window = session.get_one(Run, submission.run_id).dispute_window_s
    window = settings.dispute_window_s if window is None else window
    entry = ContributionEntry(
        address=submission.address,
        submission_id=submission.id,
        kind=EntryKind.credit if before is None else EntryKind.restore,
        units=units,
        reason="accepted by its validators",
        created_at=now,
        final_at=now + timedelta(seconds=window),
    )
    session.add(entry)
    return entry


def net_units(session: Session, submission_id: str) -> int:
    return net_units_of(session, [submission_id])[submission_id]


def net_units_of(session: Session, submission_ids: list[str]) -> dict[str, int]:
    """Each submission's credit after claw-backs, in one query."""
    query = (
        select(ContributionEntry.submission_id, func.sum(ContributionEntry.units))
        .where(ContributionEntry.submission_id.in_(submission_ids))
        .group_by(ContributionEntry.submission_id)
    )
    return dict.fromkeys(submission_ids, 0) | {i: int(units) for i, units in session.execute(query).all()}


def claw_back(
    session: Session, address: str, reason: str, now: datetime, *, cause: str, only: str | None = None, even_final: bool = False
) -> list[ContributionEntry]:
    """Negative entries cancelling ``address``'s still-pending credit (of submission ``only``, if
    given; ``even_final``: its final credit too, for work found invalid), caused by submission ``cause``."""
    query = select(
        ContributionEntry.submission_id,
        func.sum(ContributionEntry.units),
        func.max(ContributionEntry.final_at),
        func.min(ContributionEntry.id),
        func.min(ContributionEntry.final_at),
    ).where(ContributionEntry.address == address)
    if only is not None:
        query = query.where(ContributionEntry.submission_id == only)
    epoch = session.scalar(select(Epoch).order_by(Epoch.epoch.desc()).limit(1))
    entries = []
    for submission_id, units, final_at, first_id, first_final in session.execute(
        query.group_by(ContributionEntry.submission_id)
    ).all():
        if epoch is not None and first_id <= epoch.last_entry_id and first_final <= epoch.cutoff:
            continue  # counted in a root that may already pay it: it stays
        if units > 0 and (even_final or final_at > now):
            entry = ContributionEntry(
                address=address,
                submission_id=submission_id,
                kind=EntryKind.clawback,
                units=-units,
                reason=reason,
                created_at=now,
                final_at=final_at,
                cause_id=cause,
            )
            session.add(entry)
            entries.append(entry)
    return entries


def restore(session: Session, cause: str, reason: str, now: datetime) -> list[ContributionEntry]:
    """Give back what clawbacks caused by submission ``cause`` took (its rejection was overturned)."""
    query = (
        select(
            ContributionEntry.address,
            ContributionEntry.submission_id,
            func.sum(ContributionEntry.units),
            func.max(ContributionEntry.final_at),
        )
        .where(ContributionEntry.cause_id == cause)
        .group_by(ContributionEntry.address, ContributionEntry.submission_id)
    )
    entries = []
    for address, submission_id, units, final_at in session.execute(query).all():
        if units < 0:
            entry = ContributionEntry(
                address=address,
                submission_id=submission_id,
                kind=EntryKind.restore,
                units=-units,
                reason=reason,
                created_at=now,
                final_at=final_at,
                cause_id=cause,
            )
            session.add(entry)
            entries.append(entry)
    return entries


def balance(session: Session, address: str, now: datetime) -> tuple[int, int]:
    """(pending, final) credit micro-units of ``address``."""
    is_final = ContributionEntry.final_at <= now
    pending, final = session.execute(
        select(
            func.coalesce(func.sum(case((is_final, 0), else_=ContributionEntry.units)), 0),
            func.coalesce(func.sum(case((is_final, ContributionEntry.units), else_=0)), 0),
        ).where(ContributionEntry.address == address)
    ).one()
    return int(pending), int(final)


def entries_between(session: Session, since: datetime | None, until: datetime | None, limit: int) -> list[ContributionEntry]:
    """Ledger entries created within [since, until), oldest first (for exports)."""
    query = select(ContributionEntry).order_by(ContributionEntry.id).limit(limit)
    if since is not None:
        query = query.where(ContributionEntry.created_at >= since)
    if until is not None:
        query = query.where(ContributionEntry.created_at < until)
    return list(session.scalars(query))
