"""Shardcast on the coordinator: trainers post signed manifests, relays register, anyone reads both.

Reads are public (a manifest is useless without the role list, which is public too, and the
weights themselves come from relays); writes are signed and need the matching role.
"""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request

from intellect_protocol.coordinator.deps import Ctx, LedgerDep, Settings, Signed, client_rate_limit
from intellect_protocol.coordinator.errors import ApiError
from intellect_protocol.coordinator.services import roles, shardcast
from intellect_protocol.coordinator.shardcast_models import PolicyManifest
from intellect_protocol.shared.relay_schemas import RelayInfo, RelayRegister, RelayReportRequest
from intellect_protocol.shared.schemas import INT32_MAX, ErrorBody, ErrorCode, RoleName
from intellect_protocol.shared.shardcast.manifest import ManifestEntry, SignedManifest

router = APIRouter(prefix="/v1", tags=["shardcast"], responses={401: {"model": ErrorBody}, 429: {"model": ErrorBody}})
RunId = Annotated[str, Query(max_length=64)]


def _entry(row: PolicyManifest) -> ManifestEntry:
    return ManifestEntry(
        id=row.id,
        run_id=row.run_id,
        step=row.step,
        signed=SignedManifest.model_validate_json(row.body),
        created_at=row.created_at,
    )


@router.post(
    "/manifests",
    response_model=ManifestEntry,
    status_code=201,
    responses={403: {"model": ErrorBody}, 404: {"model": ErrorBody}, 409: {"model": ErrorBody}, 422: {"model": ErrorBody}},
)
async def publish(body: SignedManifest, ctx: Ctx, signed: Signed, ledger: LedgerDep, settings: Settings) -> ManifestEntry:
    """Register policy step N's manifest (trainer role); the run's policy step moves to N. For a run trained by
    islands, 409 ``awaiting_vouches`` until most live islands vouch for its content and publisher."""
    row = await ledger.run_signed(signed, shardcast.publish, body, ledger.now(), settings.island_lease_s)
    ctx.manifest_published.notify()
    return _entry(row)


@router.get("/manifests", response_model=list[ManifestEntry], dependencies=[Depends(client_rate_limit)])
async def manifests_after(
    request: Request,
    ctx: Ctx,
    ledger: LedgerDep,
    settings: Settings,
    after: Annotated[int, Query(ge=0, le=INT32_MAX)] = 0,
    run: Annotated[str | None, Query(max_length=64)] = None,
    wait_s: Annotated[float, Query(ge=0, le=300)] = 0,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
) -> list[ManifestEntry]:
    """Manifests registered after log position ``after``; with ``wait_s``, hold the request
    until one arrives or the wait ends (a long-poll: relays learn of a step within moments)."""
    deadline = time.monotonic() + min(wait_s, settings.manifest_wait_max_s)
    while True:
        wakeup = ctx.manifest_published
        rows = await ledger.run(shardcast.after, after, run, limit)
        remaining = deadline - time.monotonic()
        if rows or remaining <= 0 or await request.is_disconnected():
            return [_entry(r) for r in rows]
        # Woken at once by a publish on this process; other replicas' publishes are seen within a second.
        await wakeup.wait(min(1.0, remaining))


@router.get("/manifests/{run_id}/{step}", response_model=ManifestEntry, responses={404: {"model": ErrorBody}})
async def get_manifest(run_id: str, step: str, ledger: LedgerDep) -> ManifestEntry:
    """One step's manifest; ``latest`` for the newest."""
    number = None if step == "latest" else _step_number(step)
    return _entry(await ledger.run(shardcast.get, run_id, number))


def _step_number(step: str) -> int:
    if not (step.isascii() and step.isdigit()) or len(step) > 9:
        raise ApiError(ErrorCode.validation_error, "step must be a number or 'latest'.")
    return int(step)


@router.get("/roles/{role}", response_model=list[str])
async def role_holders(role: RoleName, ledger: LedgerDep) -> list[str]:
    """Addresses holding ``role`` now: clients trust manifests signed by a current trainer only."""
    return await ledger.run(roles.holders, role)


@router.post("/relays", response_model=RelayInfo, responses={403: {"model": ErrorBody}})
async def register_relay(body: RelayRegister, signed: Signed, ledger: LedgerDep) -> RelayInfo:
    """Announce (or refresh, every so often) where this relay serves; needs the relay role."""
    relay = await ledger.run_signed(signed, shardcast.register_relay, body, ledger.now())
    return RelayInfo.model_validate(relay, from_attributes=True)


@router.get("/relays", response_model=list[RelayInfo])
async def live_relays(ledger: LedgerDep, settings: Settings) -> list[RelayInfo]:
    rows = await ledger.run(shardcast.live_relays, ledger.now(), settings.relay_ttl_s)
    return [RelayInfo.model_validate(r, from_attributes=True) for r in rows]


@router.post("/relays/reports", status_code=204, responses={404: {"model": ErrorBody}})
async def report_relay(body: RelayReportRequest, signed: Signed, ledger: LedgerDep) -> None:
    """A client tells the coordinator that a relay served bad bytes or failed it."""
    await ledger.run_signed(signed, shardcast.report, body, ledger.now())
