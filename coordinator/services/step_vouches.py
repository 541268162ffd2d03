"""Islands vouch for a policy step before it is published: the step a trainer island publishes must hold what
most of the run's live islands built from the agreed weights, come from the island they chose, and be settled
with the record they computed.

After a committed meeting every island of it builds the step's files from the agreed weights (identical on
every honest island) and vouches for their :meth:`~shared.shardcast.manifest.Manifest.content_digest`, the
publisher the meeting chose, and the step's record (:func:`shared.island_schemas.step_record`: whose
pseudo-gradients the average included, who was left out and why). A manifest for the step is accepted only from
that publisher, with that content, once islands of more than half the run's live trainer addresses vouch for
both; until then the publisher is told to wait (409 ``awaiting_vouches``) and nothing changes. The step is
settled (shares consumed, released, islands marked excluded) only with the record most of its vouchers vouched
for. One lying
island among several can neither publish what it likes, nor name itself publisher, nor release or exclude
another's shares; with two live islands, one can stall the run (never move it).

An island that recovers from a peer (torchft hands it the state of the peer with the highest step, whatever
that peer says) keeps it only if the coordinator holds the same content for that step
(:func:`require_agreed`): published, or vouched for by most of the other live islands. A liar cannot make a
recovering island its second voice.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import func, select
from sqlalchemy.orm import Session
from sqlalchemy.sql.elements import ColumnElement

from intellect_protocol.coordinator.errors import ApiError
from intellect_protocol.coordinator.island_models import Island, StepVouch
from intellect_protocol.coordinator.models import Run
from intellect_protocol.coordinator.services import islands
from intellect_protocol.coordinator.shardcast_models import PolicyManifest
from intellect_protocol.shared.island_schemas import IslandHealCheck, IslandVouch
from intellect_protocol.shared.schemas import ErrorCode
from intellect_protocol.shared.shardcast.manifest import Manifest, SignedManifest


def vouch(session: Session, signer: str, body: IslandVouch, now: datetime) -> None:
    """Record the caller's island's word on ``body.step``: one of the next two steps (the second after a lost
    one). Vouching again alike changes nothing; an island does not change its word (409)."""
    run, island = islands.own_island(session, signer, body, now)
    if not run.policy_step < body.step <= run.policy_step + 2:
        raise ApiError(
            ErrorCode.conflict,
            f"Policy step {run.policy_step} of {run.id} is published: step {body.step} is not one of the next.",
        )
    said = session.get(StepVouch, (run.id, body.step, island.name))
    if said is None:
        session.add(
            StepVouch(
                run_id=run.id,
                step=body.step,
                island=island.name,
                address=signer,
                content=body.content,
                publisher=body.publisher,
                record=body.record,
                created_at=now,
            )
        )
    elif (said.content, said.publisher, said.record) != (body.content, body.publisher, body.record):
        raise ApiError(ErrorCode.conflict, f"Island {island.name!r} vouched otherwise for step {body.step} of {run.id}.")


def require_vouched(session: Session, run: Run, signer: str, manifest: Manifest, now: datetime, lease_s: float) -> None:
    """Refuse (409 ``awaiting_vouches``) a manifest for an island run unless islands of most live trainer
    addresses (seen within ``lease_s``) vouch for its content with ``signer``'s island as publisher."""
    publishers = select(Island.name).where(Island.run_id == run.id, Island.address == signer)
    agreeing, needed, live = _count(
        session,
        run,
        manifest.step,
        now,
        lease_s,
        StepVouch.content == manifest.content_digest(),
        StepVouch.publisher.in_(publishers),
    )
    if agreeing < needed:
        raise ApiError(
            ErrorCode.awaiting_vouches,
            f"Policy step {manifest.step} of {run.id}: {agreeing} of the {needed} trainer addresses needed ({live} live) "
            f"vouch for this content from this publisher; {_vouched(session, run, manifest.step)} islands vouched for the step in all.",
        )


def require_agreed(session: Session, signer: str, body: IslandHealCheck, now: datetime, lease_s: float) -> None:
    """Refuse (409) a peer's state for ``body.step`` that the caller's island received, unless its content is the
    step's published content or, for a step not yet published, most of the other live trainer addresses vouch
    for it (with two islands, the peer's own word: as a lone live island publishes by it). A silent island's
    word counts for nothing here."""
    run, _ = islands.own_island(session, signer, body, now)
    if body.step <= run.policy_step:
        row = session.scalar(select(PolicyManifest).where(PolicyManifest.run_id == run.id, PolicyManifest.step == body.step))
        if row is not None and SignedManifest.model_validate_json(row.body).manifest.content_digest() == body.content:
            return
        raise ApiError(ErrorCode.conflict, f"Policy step {body.step} of {run.id} was published with other content.")
    live_others = select(Island.address).where(
        Island.run_id == run.id, Island.last_seen >= now - timedelta(seconds=lease_s), Island.address != signer
    )
    agreeing, _, live = _count(
        session, run, body.step, now, lease_s, StepVouch.content == body.content, StepVouch.address.in_(live_others)
    )
    others = live - 1  # the caller is live: it just said so
    if agreeing < others // 2 + 1:
        raise ApiError(
            ErrorCode.conflict,
            f"Policy step {body.step} of {run.id} is not published, and {agreeing} of the other {others} live trainer "
            "addresses vouch for this content: most must.",
        )


def require_record(session: Session, run: Run, step: int, record: str) -> None:
    """Refuse (409) to settle policy step ``step`` with a record that most of the islands that vouched for the
    step did not vouch for: a publisher cannot release or exclude by its word alone. (Most of those who vouched,
    not of those live now: a step an island published alone, its peer dead, is settled by what it vouched.)"""
    vouched = select(func.count(func.distinct(StepVouch.address))).where(StepVouch.run_id == run.id, StepVouch.step == step)
    agreeing = session.scalar(vouched.where(StepVouch.record == record)) or 0
    said = session.scalar(vouched) or 0
    if agreeing * 2 <= said:
        raise ApiError(
            ErrorCode.conflict,
            f"Policy step {step} of {run.id}: {agreeing} of the {said} trainer addresses that vouched for the step vouch for "
            "this record of who was included and left out; settling needs most of them.",
        )


def _count(
    session: Session, run: Run, step: int, now: datetime, lease_s: float, *agree: ColumnElement[bool]
) -> tuple[int, int, int]:
    """(trainer addresses whose islands vouched for ``step`` as ``agree`` says, how many are needed, how many are live)."""
    live_since = now - timedelta(seconds=lease_s)
    live = session.scalar(
        select(func.count(func.distinct(Island.address))).where(Island.run_id == run.id, Island.last_seen >= live_since)
    )
    agreeing = session.scalar(
        select(func.count(func.distinct(StepVouch.address))).where(StepVouch.run_id == run.id, StepVouch.step == step, *agree)
    )
    return agreeing or 0, (live or 0) // 2 + 1, live or 0


def _vouched(session: Session, run: Run, step: int) -> int:
    said = session.scalar(select(func.count()).select_from(StepVouch).where(StepVouch.run_id == run.id, StepVouch.step == step))
    return said or 0
