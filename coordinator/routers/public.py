"""Public, unauthenticated endpoints: what anyone may know about the network."""

from __future__ import annotations

import functools
import time
from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request, Response
from pydantic import TypeAdapter
from sqlalchemy.orm import Session

from intellect_protocol.coordinator.context import Context
from intellect_protocol.coordinator.deps import Ctx, LedgerDep, Settings, aggregate_rate_limit, client_rate_limit
from intellect_protocol.coordinator.errors import ApiError
from intellect_protocol.coordinator.services import (
    accountability,
    credit,
    islands,
    leaderboard,
    learning_signal,
    nodes,
    receipts,
    runs,
    step_timing,
    training,
)
from intellect_protocol.shared.committee import PublicReceipt, ValidatorStanding
from intellect_protocol.shared.island_schemas import IslandStatus
from intellect_protocol.shared.public_schemas import Credit, LeaderboardRow, NetworkStatus, PublicNode, ThroughputBucket
from intellect_protocol.shared.run_schemas import RunInfo, RunProgress, StepTiming
from intellect_protocol.shared.schemas import Address, ErrorBody, ErrorCode, PublicStatus
from intellect_protocol.shared.version import PROTOCOL_VERSION, __version__

router = APIRouter(prefix="/v1/public", tags=["public"], dependencies=[Depends(client_rate_limit)])

MAX_BUCKETS = 720
"""Most buckets one throughput answer holds (12 hours by the minute; a day needs 2-minute buckets)."""


async def _shared(ctx: Context, key: tuple[object, ...], shape: Any, compute: Callable[[], Awaitable[Any]]) -> Response:
    """A public aggregate as JSON, rendered once per :data:`~coordinator.context.PUBLIC_READ_TTL_S` for every
    reader: a flood of readers costs the ledger one query per key, not one per request."""

    async def render() -> bytes:
        return _adapter(shape).dump_json(await compute())

    return Response(await ctx.public_reads.get(key, render), media_type="application/json")


@functools.cache
def _adapter(shape: Any) -> TypeAdapter[Any]:
    return TypeAdapter(shape)


@router.get("")
async def index(request: Request) -> dict[str, object]:
    """What this API offers anyone: every public endpoint, and where each is documented."""
    # Read from the OpenAPI document, a published format, not from the app's route objects, whose shape changes
    # between FastAPI releases (0.165 nests included routers: the list came out empty).
    documented: dict[str, dict[str, object]] = request.app.openapi()["paths"]
    paths = {path for path, methods in documented.items() if path.startswith(f"{router.prefix}/") and "get" in methods}
    return {"endpoints": sorted(paths), "docs": "/docs", "openapi": "/openapi.json"}


@router.get("/status", response_model=PublicStatus)
async def status(ctx: Ctx, ledger: LedgerDep, settings: Settings) -> PublicStatus:
    return PublicStatus(
        coordinator_version=__version__,
        min_node_version=settings.min_node_version,
        audience=ctx.audience,
        heartbeat_interval_s=settings.heartbeat_interval_s,
        signature_window_s=settings.signature_window_s,
        nodes=await ledger.run(nodes.status_counts),
        server_time=time.time(),
        max_leases_per_node=settings.max_leases_per_node,
        protocol_version=PROTOCOL_VERSION,
    )


@router.get("/time")
async def server_time() -> dict[str, float]:
    """The coordinator's clock, for nodes measuring their skew; touches no database."""
    return {"server_time": time.time()}


@router.get("/submissions", response_model=list[PublicReceipt])
async def node_receipts(
    address: Address, ledger: LedgerDep, limit: Annotated[int, Query(ge=1, le=500)] = 50
) -> list[PublicReceipt]:
    """One node's newest receipts (what ``intellect-node receipts`` shows)."""
    return await ledger.run(receipts.receipts_of, address, limit)


@router.get("/submissions/{submission_id}", response_model=PublicReceipt, responses={404: {"model": ErrorBody}})
async def submission_receipt(submission_id: str, ledger: LedgerDep) -> PublicReceipt:
    """A submission's public receipt: status, every check's result and reason, credit, validator."""
    return await ledger.run(receipts.public_receipt, submission_id)


@router.get("/nodes/{address}/credit", response_model=Credit)
async def node_credit(address: Address, ledger: LedgerDep) -> Credit:
    """A node's credit: the sum of its ledger entries, pending and final."""
    pending, final = await ledger.run(credit.balance, address, ledger.now())
    return Credit(address=address, pending=pending, final=final)


@router.get("/runs/{run_id}", response_model=RunInfo, responses={404: {"model": ErrorBody}})
async def run_info(run_id: str, ledger: LedgerDep) -> RunInfo:
    return RunInfo.model_validate(await ledger.run(runs.get_run, run_id), from_attributes=True)


@router.get("/runs/{run_id}/progress", response_model=RunProgress, responses={404: {"model": ErrorBody}})
async def run_progress(run_id: str, ledger: LedgerDep) -> RunProgress:
    """A run's submissions by status, every policy step's training metrics (for dashboards and charts), and whether
    the work accepted since the current step can teach the trainer anything."""

    now = ledger.now()

    def read(session: Session) -> RunProgress:
        run = runs.get_run(session, run_id)
        steps = [{"step": m.step, **m.metrics} for m in training.metrics_of(session, run_id)]
        evaluations = [{"step": e.step, **e.metrics} for e in training.evaluations_of(session, run_id)]
        learning = learning_signal.learning_signal(session, run, now)
        return RunProgress(
            submissions=training.run_stats(session, run_id), steps=steps, evaluations=evaluations, learning=learning
        )

    return await ledger.run(read)


@router.get("/runs/{run_id}/islands", response_model=list[IslandStatus], responses={404: {"model": ErrorBody}})
async def run_islands(run_id: str, ledger: LedgerDep) -> list[IslandStatus]:
    """The run's trainer islands: their outer steps, their shares of accepted work, and why any was left out."""

    def read(session: Session) -> list[IslandStatus]:
        runs.get_run(session, run_id)
        return islands.statuses(session, run_id)

    return await ledger.run(read)


@router.get("/runs/{run_id}/step-timing", response_model=list[StepTiming], responses={404: {"model": ErrorBody}})
async def run_step_timing(run_id: str, ledger: LedgerDep, limit: Annotated[int, Query(ge=1, le=1000)] = 200) -> list[StepTiming]:
    """Where each of the last ``limit`` policy steps' wall clock went: node, upload, validation, the trainer."""
    return await ledger.run(step_timing.step_timings, run_id, limit)


@router.get("/runs", response_model=list[RunInfo])
async def list_runs(ledger: LedgerDep) -> list[RunInfo]:
    """Every run, newest first."""
    return [RunInfo.model_validate(r, from_attributes=True) for r in await ledger.run(runs.list_runs)]


@router.get(
    "/runs/{run_id}/throughput",
    response_model=list[ThroughputBucket],
    responses={404: {"model": ErrorBody}, 422: {"model": ErrorBody}},
    dependencies=[Depends(aggregate_rate_limit)],
)
async def run_throughput(
    run_id: str,
    ctx: Ctx,
    ledger: LedgerDep,
    minutes: Annotated[int, Query(ge=1, le=24 * 60)] = 60,
    bucket_s: Annotated[int, Query(ge=10, le=3600)] = 60,
) -> Response:
    """Rollouts uploaded and tokens accepted per time bucket, over the last ``minutes`` (at most 720 buckets)."""
    if minutes * 60 > MAX_BUCKETS * bucket_s:
        raise ApiError(
            ErrorCode.validation_error,
            f"{minutes} minutes in {bucket_s} s buckets is more than {MAX_BUCKETS} buckets: ask for wider buckets.",
        )

    def read(session: Session) -> list[ThroughputBucket]:
        runs.get_run(session, run_id)
        return leaderboard.throughput(session, run_id, ledger.now(), minutes, bucket_s)

    return await _shared(ctx, ("throughput", run_id, minutes, bucket_s), list[ThroughputBucket], lambda: ledger.run(read))


@router.get("/validators", response_model=list[ValidatorStanding], dependencies=[Depends(aggregate_rate_limit)])
async def validators(ctx: Ctx, ledger: LedgerDep) -> Response:
    """Every validator, active or revoked: verdicts given, how often they agreed with the majority, strikes."""
    return await _shared(ctx, ("validators",), list[ValidatorStanding], lambda: ledger.run(accountability.standings))


@router.get("/leaderboard", response_model=list[LeaderboardRow], dependencies=[Depends(aggregate_rate_limit)])
async def ranking(ctx: Ctx, ledger: LedgerDep, limit: Annotated[int, Query(ge=1, le=5000)] = 500) -> Response:
    """Nodes ranked by final credit, then pending credit."""
    return await _shared(
        ctx, ("leaderboard", limit), list[LeaderboardRow], lambda: ledger.run(leaderboard.ranking, ledger.now(), limit)
    )


@router.get("/network", response_model=NetworkStatus)
async def network(ledger: LedgerDep, settings: Settings) -> NetworkStatus:
    """Policy step, nodes online, rollouts per minute, validation backlog, rejection rate, relays."""
    return await ledger.run(leaderboard.network, settings, ledger.now())


@router.get("/nodes/{address}", response_model=PublicNode, responses={404: {"model": ErrorBody}})
async def public_node(address: Address, ledger: LedgerDep) -> PublicNode:
    """A node's status, credit and submission counts (its receipts: ``/v1/public/submissions?address=``)."""
    return await ledger.run(leaderboard.public_node, address, ledger.now())
