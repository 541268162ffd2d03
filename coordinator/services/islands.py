"""Trainer islands' shares of a run's accepted submissions: each one handed to exactly one island, and
trained on exactly once across joins, leaves and crashes (:mod:`shared.island_schemas` says how a share
moves). Every call locks the run's row, so two islands never claim the same submission.

An island's name belongs to the trainer address that first used it in the run: another trainer cannot
join as it, release its claims or report for it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, cast

from sqlalchemy import and_, case, delete, false, func, or_, select, update
from sqlalchemy.engine import CursorResult, Result
from sqlalchemy.orm import Session
from sqlalchemy.sql.elements import ColumnElement

from intellect_protocol.coordinator.errors import ApiError
from intellect_protocol.coordinator.island_models import Island, IslandShare
from intellect_protocol.coordinator.models import Run, TrainerMetrics
from intellect_protocol.coordinator.services import island_audits, pretraining, roles, step_vouches, training
from intellect_protocol.coordinator.shardcast_models import PolicyManifest
from intellect_protocol.shared.island_schemas import (
    MAX_SHARE,
    IslandClaim,
    IslandJoin,
    IslandReport,
    IslandSettle,
    IslandStatus,
    SettleReply,
    step_record,
)
from intellect_protocol.shared.schemas import AcceptedRollouts, ErrorCode, RoleName
from intellect_protocol.shared.states import RunKind, ShareState


def own_island(session: Session, signer: str, body: IslandJoin, now: datetime) -> tuple[Run, Island]:
    """The run (locked) and the caller's island, made on first use; 403 if another trainer holds the name."""
    roles.require(session, signer, RoleName.trainer).last_seen = now
    run = session.get(Run, body.run_id, with_for_update=True)
    if run is None:
        raise ApiError(ErrorCode.not_found, f"No run {body.run_id}.")
    island = session.get(Island, (run.id, body.island))
    if island is None:
        island = Island(
            run_id=run.id, name=body.island, address=signer, joined_at=now, last_seen=now, outer_step=-1, excluded_steps=0
        )
        session.add(island)
    elif island.address != signer:
        raise ApiError(ErrorCode.role_required, f"Island {body.island!r} of {run.id} belongs to another trainer.")
    island.last_seen = now
    return run, island


def join(session: Session, signer: str, body: IslandJoin, now: datetime) -> int:
    """An island (re)starting: its unreported claims go back to the pool; returns how many."""
    run, island = own_island(session, signer, body, now)
    island.joined_at = now
    return _count(session.execute(delete(IslandShare).where(*_claimed_by(island))))


def claim(session: Session, signer: str, body: IslandClaim, now: datetime, lease_s: float) -> list[AcceptedRollouts]:
    """Up to ``limit`` accepted submissions no island holds, oldest first, now held by the caller, after
    those it holds unreported already (so a claim whose answer was lost is not lost with it: the island
    skips what it has). Nothing new while the caller's trainer address, over all its islands, holds its
    fair share (:func:`fair_share`): one that keeps claiming cannot starve the others. Claims of islands
    silent for ``lease_s`` are released first. 409 for a pretraining run (its islands claim shards:
    :func:`coordinator.services.pretraining.claim_shards`)."""
    run, island = own_island(session, signer, body, now)
    if run.kind != RunKind.rl:
        raise ApiError(ErrorCode.conflict, f"{run.id} is a pretraining run: its islands claim shards, not rollouts.")
    live_since = release_silent(session, run, now, lease_s)
    mine = select(IslandShare.cursor).where(*_claimed_by(island))
    already = training.accepted(session, run.id, 0, MAX_SHARE, including=mine)
    held = select(IslandShare.cursor).where(IslandShare.run_id == run.id)
    free = room(session, island, live_since, lambda most: training.count_accepted(session, run.id, held, most))
    entries = training.accepted(session, run.id, 0, min(body.limit, free), excluding=held) if free else []
    for e in entries:
        session.add(IslandShare(run_id=run.id, cursor=e.cursor, island=island.name, state=ShareState.claimed, claimed_at=now))
    if entries:
        # Backpressure (:mod:`coordinator.services.admission`) reads what lies after this as unread.
        run.trainer_cursor = max(run.trainer_cursor, entries[-1].cursor)
    return already + entries


def release_silent(session: Session, run: Run, now: datetime, lease_s: float) -> datetime:
    """Claims of the run's islands silent for ``lease_s`` go back to the pool; returns since when an island is live."""
    live_since = now - timedelta(seconds=lease_s)
    silent = select(Island.name).where(Island.run_id == run.id, Island.last_seen < live_since)
    session.execute(
        delete(IslandShare).where(
            IslandShare.run_id == run.id, IslandShare.state == ShareState.claimed, IslandShare.island.in_(silent)
        )
    )
    return live_since


def room(session: Session, island: Island, live_since: datetime, claimable: Callable[[int], int]) -> int:
    """How many more claims ``island`` may take: its trainer address' :func:`fair_share` less what all the
    address' islands hold claimed."""
    names = select(Island.name).where(Island.run_id == island.run_id, Island.address == island.address)
    by_address = session.scalar(
        select(func.count())
        .select_from(IslandShare)
        .where(IslandShare.run_id == island.run_id, IslandShare.state == ShareState.claimed, IslandShare.island.in_(names))
    )
    return max(0, fair_share(session, island.run_id, live_since, claimable) - (by_address or 0))


def fair_share(session: Session, run_id: str, live_since: datetime, claimable: Callable[[int], int]) -> int:
    """The most claims one trainer address may hold: an equal part of the pool (what islands hold claimed and
    what they may claim: ``claimable(most)``, counted up to ``most``) among the addresses of islands seen since
    ``live_since``, and never more than :data:`MAX_SHARE`, what one island may report for an outer step."""
    live = session.scalar(
        select(func.count(func.distinct(Island.address))).where(Island.run_id == run_id, Island.last_seen >= live_since)
    )
    live = max(1, live or 0)
    claimed = session.scalar(
        select(func.count()).select_from(IslandShare).where(IslandShare.run_id == run_id, IslandShare.state == ShareState.claimed)
    )
    # Past MAX_SHARE a live address, everyone's part is MAX_SHARE: no need to count further.
    return min(MAX_SHARE, math.ceil(((claimed or 0) + claimable(MAX_SHARE * live)) / live))


def _claimed_by(island: Island) -> tuple[ColumnElement[bool], ...]:
    return IslandShare.run_id == island.run_id, IslandShare.island == island.name, IslandShare.state == ShareState.claimed


def report(session: Session, signer: str, body: IslandReport, now: datetime) -> None:
    """The caller's claims its pseudo-gradient for ``outer_step`` learned from become pending under it;
    409 (and nothing changes) if any is no longer the caller's to report (the island must stay out of
    the step, or the submission would be trained on twice) or ``outer_step`` is not the run's next."""
    run, island = own_island(session, signer, body, now)
    # Outer step k starts from policy step k, published already or (its publisher dead) at the next meeting.
    # A share reported under any other step would wait for a settling that never comes.
    if not run.policy_step <= body.outer_step <= run.policy_step + 1:
        raise ApiError(
            ErrorCode.conflict,
            f"Outer step {body.outer_step} is not the run's next one: policy step {run.policy_step} is published.",
        )
    cursors = sorted(set(body.cursors))
    mine = (IslandShare.run_id == run.id, IslandShare.island == island.name, IslandShare.cursor.in_(cursors))
    # A repeat of a report whose answer was lost finds its claims pending under the same attempt.
    again = and_(
        IslandShare.state == ShareState.pending, IslandShare.outer_step == body.outer_step, IslandShare.attempt == body.attempt
    )
    held = session.scalar(
        select(func.count()).select_from(IslandShare).where(*mine, or_(IslandShare.state == ShareState.claimed, again))
    )
    if held != len(cursors):
        raise ApiError(
            ErrorCode.conflict,
            f"{len(cursors) - (held or 0)} of these {len(cursors)} submissions are not claimed by island {island.name!r} "
            "(released after its lease, reported already, or never claimed); it must stay out of this outer step.",
        )
    reported = {
        "state": ShareState.pending,
        "outer_step": body.outer_step,
        "attempt": body.attempt,
        "start_digest": body.start_digest,
    }
    if run.kind == RunKind.pretrain:  # a few whole shards: the order they were learnt in is what an audit replays
        order = {cursor: i for i, cursor in reversed(list(enumerate(body.cursors)))}
        reported["position"] = case(order, value=IslandShare.cursor)
    session.execute(update(IslandShare).where(*mine).values(**reported))
    island.outer_step = max(island.outer_step, body.outer_step)


def settle(session: Session, signer: str, body: IslandSettle, now: datetime) -> SettleReply:
    """Outer step ``outer_step`` was published as policy step ``outer_step + 1``: the included attempts'
    claims are consumed, every other pending claim of that step or older goes back, and in a pretraining run the
    step's audits are drawn (:func:`coordinator.services.island_audits.draw`). 409 unless the step is
    published and its record is the one most of the islands that vouched for it vouched for (and, in a run that
    audits, names every included pseudo-gradient's sha256), 403 unless the caller published it or a later step.
    Settling again changes nothing."""
    run, _ = own_island(session, signer, body, now)
    step = body.outer_step + 1
    if run.policy_step < step:
        raise ApiError(ErrorCode.conflict, f"Policy step {step} of {run.id} is not published.")
    published = select(PolicyManifest.id).where(
        PolicyManifest.run_id == run.id, PolicyManifest.step >= step, PolicyManifest.signer == signer
    )
    if session.scalar(published.limit(1)) is None:
        # A later publisher may settle it: the one that published it may have died before it could.
        raise ApiError(ErrorCode.role_required, f"Only an island that published policy step {step} or a later one settles it.")
    step_vouches.require_record(session, run, step, step_record(body.included, body.excluded))
    island_audits.require_digests(run, body)
    pending = (IslandShare.run_id == run.id, IslandShare.state == ShareState.pending, IslandShare.outer_step <= body.outer_step)
    included = or_(false(), *(and_(IslandShare.island == i.island, IslandShare.attempt == i.attempt) for i in body.included))
    consumed = _count(session.execute(update(IslandShare).where(*pending, included).values(state=ShareState.consumed)))
    session.execute(delete(IslandShare).where(*pending))
    if run.kind == RunKind.rl:  # a pretraining slot is no read position of accepted work: its steps have no such timing
        # The step's read position, for its timing (:mod:`coordinator.services.step_timing`): the furthest share trained on.
        reached = select(func.max(IslandShare.cursor)).where(
            IslandShare.run_id == run.id, IslandShare.state == ShareState.consumed
        )
        session.execute(
            update(TrainerMetrics)
            .where(TrainerMetrics.run_id == run.id, TrainerMetrics.step == step, TrainerMetrics.cursor.is_(None))
            .values(cursor=reached.scalar_subquery())
        )
    for name, reason in body.excluded.items():
        told = f"outer step {body.outer_step}: {reason}"
        if (island := session.get(Island, (run.id, name))) is not None and island.last_exclusion != told:  # once a step
            island.excluded_steps += 1
            island.last_exclusion = told
    audits = island_audits.draw(session, run, body, now) if run.kind == RunKind.pretrain else []
    return SettleReply(consumed=consumed, audits=audits)


def statuses(session: Session, run_id: str) -> list[IslandStatus]:
    """A run's islands with their shares by state (and, in a pretraining run, the tokens of the consumed ones), for
    the public status and the page."""
    run = session.get(Run, run_id)
    pretrain = run is not None and run.kind == RunKind.pretrain
    tokens = pretraining.consumed_tokens(session, run) if run is not None and pretrain else {}
    audits = island_audits.by_island(session, run_id) if pretrain else {}
    counts = {
        (name, state): n
        for name, state, n in session.execute(
            select(IslandShare.island, IslandShare.state, func.count())
            .where(IslandShare.run_id == run_id)
            .group_by(IslandShare.island, IslandShare.state)
        )
    }
    return [
        IslandStatus(
            name=i.name,
            address=i.address,
            joined_at=i.joined_at,
            last_seen=i.last_seen,
            outer_step=i.outer_step,
            claimed=counts.get((i.name, ShareState.claimed), 0),
            pending=counts.get((i.name, ShareState.pending), 0),
            consumed=counts.get((i.name, ShareState.consumed), 0),
            excluded_steps=i.excluded_steps,
            last_exclusion=i.last_exclusion,
            tokens=tokens.get(i.name, 0) if pretrain else None,
            audits=audits.get(i.name, {}) if pretrain else None,
        )
        for i in session.scalars(select(Island).where(Island.run_id == run_id).order_by(Island.name))
    ]


def _count(result: Result[Any]) -> int:
    return cast(CursorResult[Any], result).rowcount or 0
