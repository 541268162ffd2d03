"""Pretraining runs' shards: each training shard is handed to one island once an epoch, through the same claims,
reports and settling as accepted rollouts (:mod:`coordinator.services.islands`), a claim's cursor naming a slot
(:class:`shared.island_schemas.ShardSlot`). Slots are claimed lowest first, so an epoch is handed out before the
next, and a slot released (its island restarted, went silent or was left out of a step) is handed out again next.

The shards' bytes are in the blob store under :func:`shard_key`, put there when the run was created and checked
against the corpus manifest then; islands check them again as they fetch them.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from itertools import islice

from sqlalchemy import func, select
from sqlalchemy.orm import Session, aliased

from intellect_protocol.coordinator.errors import ApiError
from intellect_protocol.coordinator.island_models import IslandShare
from intellect_protocol.coordinator.models import Run
from intellect_protocol.coordinator.services import islands, roles, runs
from intellect_protocol.shared.island_schemas import MAX_SHARE, IslandClaim, ShardClaims, ShardSlot
from intellect_protocol.shared.pretraining.manifest import CorpusManifest
from intellect_protocol.shared.pretraining.settings import PretrainSettings
from intellect_protocol.shared.schemas import ErrorCode, RoleName
from intellect_protocol.shared.states import RunKind, ShareState


def shard_key(sha256: str) -> str:
    """Where a shard's bytes are in the blob store: by content, so runs on one corpus share them."""
    return f"corpus/{sha256}.safetensors"


def corpus_of(run: Run) -> tuple[CorpusManifest, PretrainSettings]:
    """A pretraining run's corpus and settings; 409 for an RL run."""
    if run.kind != RunKind.pretrain or run.corpus is None:
        raise ApiError(ErrorCode.conflict, f"{run.id} is an RL run: its islands claim accepted rollouts, not shards.")
    return CorpusManifest.model_validate(run.corpus), PretrainSettings.model_validate(run.pretrain or {})


def claim_shards(
    session: Session, signer: str, body: IslandClaim, now: datetime, lease_s: float, stake: int | None
) -> ShardClaims:
    """Up to ``limit`` slots no island holds, lowest first, now the caller's, after those it holds unreported;
    as fair a share as :func:`coordinator.services.islands.claim` gives, and after the same release of silent
    islands' claims. 403 unless the caller stakes the run's ``min_stake`` (``stake``: what it stakes)."""
    run, island = islands.own_island(session, signer, body, now)
    manifest, settings = corpus_of(run)
    runs.require_run_stake(run, signer, stake)
    live_since = islands.release_silent(session, run, now, lease_s)
    total = len(manifest.shards) * settings.epochs
    of_run = IslandShare.run_id == run.id
    counts = dict(session.execute(select(IslandShare.state, func.count()).where(of_run).group_by(IslandShare.state)).all())
    mine = session.scalars(
        select(IslandShare.cursor)
        .where(IslandShare.run_id == run.id, IslandShare.island == island.name, IslandShare.state == ShareState.claimed)
        .order_by(IslandShare.cursor)
        .limit(MAX_SHARE)
    ).all()
    free = islands.room(session, island, live_since, lambda most: min(most, total - sum(counts.values())))
    fresh = list(islice(_unheld(session, run.id, total), min(body.limit, free)))
    for cursor in fresh:
        session.add(IslandShare(run_id=run.id, cursor=cursor, island=island.name, state=ShareState.claimed, claimed_at=now))
    remaining = total - counts.get(ShareState.consumed, 0)
    return ShardClaims(slots=[slot(manifest, c) for c in [*mine, *fresh]], remaining=remaining)


def _unheld(session: Session, run_id: str, total: int) -> Iterator[int]:
    """The run's slots no island holds, lowest first. Slots are handed out lowest first, so below the first gap in
    the held ones every slot is held: only the rows from there on are read, about as many as are in flight."""
    held = select(IslandShare.cursor).where(IslandShare.run_id == run_id)
    after = aliased(IslandShare)
    followed = select(after.cursor).where(after.run_id == run_id, after.cursor == IslandShare.cursor + 1)
    first_gap = session.scalar(held.with_only_columns(func.min(IslandShare.cursor + 1)).where(~followed.exists()))
    start = 1 if session.scalar(held.where(IslandShare.cursor == 1)) is None else (first_gap or 1)
    beyond = set(session.scalars(held.where(IslandShare.cursor >= start)))
    return (cursor for cursor in range(start, total + 1) if cursor not in beyond)


def slot(manifest: CorpusManifest, cursor: int) -> ShardSlot:
    epoch, index = divmod(cursor - 1, len(manifest.shards))
    return ShardSlot(cursor=cursor, epoch=epoch, index=index, shard=manifest.shards[index])


def shard_blob(session: Session, signer: str, run_id: str, sha256: str) -> str:
    """The blob key of a shard of ``run_id``'s corpus (training, held-out or out-of-distribution), for a trainer or a
    validator (which replays islands' steps); 404 for any other hash."""
    if roles.active(session, signer, RoleName.validator) is None:
        roles.require(session, signer, RoleName.trainer)
    run = session.get(Run, run_id)
    if run is None:
        raise ApiError(ErrorCode.not_found, f"No run {run_id}.")
    manifest, _ = corpus_of(run)
    if sha256 not in {ref.sha256 for ref in manifest.every_shard()}:
        raise ApiError(ErrorCode.not_found, f"No shard {sha256[:12]} in the corpus of {run_id}.")
    return shard_key(sha256)


def consumed_tokens(session: Session, run: Run) -> dict[str, int]:
    """Tokens each island of a pretraining run learnt in published steps: its consumed slots' shards' tokens."""
    manifest, _ = corpus_of(run)
    consumed = select(IslandShare.island, IslandShare.cursor).where(
        IslandShare.run_id == run.id, IslandShare.state == ShareState.consumed
    )
    tokens: dict[str, int] = {}
    for island, cursor in session.execute(consumed):
        tokens[island] = tokens.get(island, 0) + slot(manifest, cursor).shard.tokens
    return tokens
