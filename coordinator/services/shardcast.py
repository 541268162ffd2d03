"""The coordinator's side of shardcast: the trust anchor for manifests, and the relay directory.

A manifest is accepted only when the request and the manifest are both signed by an
address holding the trainer role, for an existing run, at a step not yet taken (posting the
same manifest again is idempotent), and for a run trained by islands, once most live islands vouch
for it (:mod:`coordinator.services.step_vouches`). Accepting one advances the run's policy step.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from intellect_protocol.coordinator import events
from intellect_protocol.coordinator.errors import ApiError
from intellect_protocol.coordinator.island_models import Island
from intellect_protocol.coordinator.models import Run
from intellect_protocol.coordinator.services import island_audits, roles, step_vouches
from intellect_protocol.coordinator.shardcast_models import PolicyManifest, Relay, RelayReport
from intellect_protocol.shared.relay_schemas import RelayRegister, RelayReportRequest
from intellect_protocol.shared.schemas import ErrorCode, RoleName
from intellect_protocol.shared.shardcast.manifest import ManifestError, SignedManifest


def publish(session: Session, signer: str, signed: SignedManifest, now: datetime, island_lease_s: float) -> PolicyManifest:
    roles.require(session, signer, RoleName.trainer)
    if signed.signer != signer:
        raise ApiError(ErrorCode.manifest_signer_mismatch, "The manifest must be signed by the trainer posting it.")
    try:
        manifest = signed.verify()
    except ManifestError as e:
        raise ApiError(ErrorCode.manifest_invalid, str(e)) from None
    run = session.get(Run, manifest.run_id, with_for_update=True)
    if run is None:
        raise ApiError(ErrorCode.not_found, f"No run {manifest.run_id}.")
    existing = session.scalar(select(PolicyManifest).where(PolicyManifest.run_id == run.id, PolicyManifest.step == manifest.step))
    if existing is not None:
        if existing.digest == manifest.digest():
            return existing
        raise ApiError(ErrorCode.conflict, f"Step {manifest.step} of {run.id} has another manifest already.")
    if _require_next_publisher(session, run, signer, manifest.step):
        step_vouches.require_vouched(session, run, signer, manifest, now, island_lease_s)
        island_audits.require_settled(session, run, signer, manifest.step)
    row = PolicyManifest(
        run_id=run.id,
        step=manifest.step,
        signer=signer,
        digest=manifest.digest(),
        total_bytes=manifest.total_bytes,
        body=signed.model_dump_json(),
        created_at=now,
    )
    session.add(row)
    run.policy_step = max(run.policy_step, manifest.step)
    session.flush()
    events.after_commit(session, "policy step %d of %s published by %s", manifest.step, run.id, signer)
    return row


def _require_next_publisher(session: Session, run: Run, signer: str, step: int) -> bool:
    """A run moves one policy step at a time (a trainer that skipped ahead would strand every node and island
    on a step nobody trained), and a run trained by islands only by one of its islands' trainers. One gap is
    allowed to islands: the quorum's publisher of step k may die before publishing it, and the islands' next
    meeting then publishes k + 1, by an island that reported its share of outer step k. True for an island run."""
    islands = {i.address: i.outer_step for i in session.scalars(select(Island).where(Island.run_id == run.id))}
    if islands and signer not in islands:
        raise ApiError(
            ErrorCode.role_required, f"{run.id} is trained by islands: only one of their trainers publishes its steps."
        )
    after_a_lost_step = step == run.policy_step + 2 and islands.get(signer, -1) >= step - 1
    if step != run.policy_step + 1 and not after_a_lost_step:
        raise ApiError(
            ErrorCode.conflict,
            f"Policy step {run.policy_step} of {run.id} is the newest: only step {run.policy_step + 1} may be published next, not {step}.",
        )
    return bool(islands)


def get(session: Session, run_id: str, step: int | None) -> PolicyManifest:
    """The manifest of ``step`` (the newest when None)."""
    query = select(PolicyManifest).where(PolicyManifest.run_id == run_id)
    query = query.where(PolicyManifest.step == step) if step is not None else query.order_by(PolicyManifest.step.desc())
    row = session.scalars(query.limit(1)).first()
    if row is None:
        raise ApiError(ErrorCode.not_found, f"No manifest for {run_id} step {'latest' if step is None else step}.")
    return row


def after(session: Session, after_id: int, run_id: str | None, limit: int) -> list[PolicyManifest]:
    query = select(PolicyManifest).where(PolicyManifest.id > after_id)
    if run_id is not None:
        query = query.where(PolicyManifest.run_id == run_id)
    return list(session.scalars(query.order_by(PolicyManifest.id).limit(limit)))


def register_relay(session: Session, signer: str, body: RelayRegister, now: datetime) -> Relay:
    roles.require(session, signer, RoleName.relay)
    relay = session.get(Relay, signer)
    if relay is None:
        relay = Relay(address=signer, url=body.url, kind=body.kind, registered_at=now, last_seen=now)
        session.add(relay)
    else:
        relay.url, relay.kind, relay.last_seen = body.url, body.kind, now
    session.flush()
    return relay


def live_relays(session: Session, now: datetime, ttl_s: float) -> list[Relay]:
    """Relays seen within ``ttl_s`` whose address still holds the relay role."""
    holders = set(roles.holders(session, RoleName.relay))
    rows = session.scalars(select(Relay).where(Relay.last_seen >= now - timedelta(seconds=ttl_s)).order_by(Relay.address))
    return [r for r in rows if r.address in holders]


def all_relays(session: Session) -> list[tuple[Relay, int]]:
    """Every relay ever registered, with how many reports name its URL."""
    counts = dict(session.execute(select(RelayReport.relay_url, func.count()).group_by(RelayReport.relay_url)).all())
    return [(r, counts.get(r.url, 0)) for r in session.scalars(select(Relay).order_by(Relay.registered_at))]


def report(session: Session, reporter: str, body: RelayReportRequest, now: datetime) -> RelayReport:
    if session.scalar(select(Relay.address).where(Relay.url == body.relay_url).limit(1)) is None:
        raise ApiError(ErrorCode.not_found, f"No relay serves {body.relay_url}.")
    row = RelayReport(
        relay_url=body.relay_url,
        reporter=reporter,
        run_id=body.run_id,
        step=body.step,
        chunk=body.chunk,
        reason=body.reason,
        created_at=now,
    )
    session.add(row)
    session.flush()
    return row
