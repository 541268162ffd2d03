"""Islands vouch for a policy step before it is published: the step a trainer island publishes must hold what
most of the run's live islands built from the agreed weights, and come from the island they chose.

After a committed meeting every island of it builds the step's files from the agreed weights (identical on
every honest island) and vouches for their :meth:`~shared.shardcast.manifest.Manifest.content_digest` and the
publisher the meeting chose. A manifest for the step is accepted only from that publisher, with that content,
once islands of more than half the run's live trainer addresses vouch for both; until then the publisher is
told to wait (409 ``awaiting_vouches``) and nothing changes. One lying island among several can neither publish
what it likes nor name itself publisher; with two live islands, one can stall the run (never move it).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from intellect_protocol.coordinator.errors import ApiError
from intellect_protocol.coordinator.island_models import Island, StepVouch
from intellect_protocol.coordinator.models import Run
from intellect_protocol.coordinator.services.islands import own_island
from intellect_protocol.shared.island_schemas import IslandVouch
from intellect_protocol.shared.schemas import ErrorCode
from intellect_protocol.shared.shardcast.manifest import Manifest


def vouch(session: Session, signer: str, body: IslandVouch, now: datetime) -> None:
    """Record the caller's island's word on ``body.step``: one of the next two steps (the second after a lost
    one). Vouching again alike changes nothing; an island does not change its word (409)."""
    run, island = own_island(session, signer, body, now)
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
                created_at=now,
            )
        )
    elif (said.content, said.publisher) != (body.content, body.publisher):
        raise ApiError(ErrorCode.conflict, f"Island {island.name!r} vouched otherwise for step {body.step} of {run.id}.")


def require_vouched(session: Session, run: Run, signer: str, manifest: Manifest, now: datetime, lease_s: float) -> None:
    """Refuse (409 ``awaiting_vouches``) a manifest for an island run unless islands of most live trainer
    addresses (seen within ``lease_s``) vouch for its content with ``signer``'s island as publisher."""
    live_since = now - timedelta(seconds=lease_s)
    live = session.scalar(
        select(func.count(func.distinct(Island.address))).where(Island.run_id == run.id, Island.last_seen >= live_since)
    )
    needed = (live or 0) // 2 + 1
    publishers = select(Island.name).where(Island.run_id == run.id, Island.address == signer)
    agreeing = session.scalar(
        select(func.count(func.distinct(StepVouch.address))).where(
            StepVouch.run_id == run.id,
            StepVouch.step == manifest.step,
            StepVouch.content == manifest.content_digest(),
            StepVouch.publisher.in_(publishers),
        )
    )
    if (agreeing or 0) < needed:
        said = session.scalar(
            select(func.count()).select_from(StepVouch).where(StepVouch.run_id == run.id, StepVouch.step == manifest.step)
        )
        raise ApiError(
            ErrorCode.awaiting_vouches,
            f"Policy step {manifest.step} of {run.id}: {agreeing or 0} of the {needed} trainer addresses needed ({live or 0} live) "
            f"vouch for this content from this publisher; {said or 0} islands vouched for the step in all.",
        )
