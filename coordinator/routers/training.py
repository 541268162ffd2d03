"""The trainer's endpoints (role ``trainer``, signed): accepted rollouts by cursor (or, for a trainer island, by
claim: :mod:`shared.island_schemas`), their files, step metrics."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Annotated

from fastapi import APIRouter, Path, Query, Request, Response

from intellect_protocol.coordinator.blob_response import blob_response
from intellect_protocol.coordinator.context import Context
from intellect_protocol.coordinator.deps import Ctx, LedgerDep, Settings, Signed, SignedPseudoGradient
from intellect_protocol.coordinator.services import island_audits, islands, pretraining, step_timing, step_vouches, training
from intellect_protocol.coordinator.wakeup import long_poll
from intellect_protocol.shared.island_schemas import (
    IslandClaim,
    IslandHealCheck,
    IslandJoin,
    IslandReport,
    IslandSettle,
    IslandVouch,
    SettleReply,
    ShardClaims,
)
from intellect_protocol.shared.schemas import INT32_MAX, AcceptedRollouts, ErrorBody, TrainerMetricsRequest

router = APIRouter(
    prefix="/v1/trainer",
    tags=["trainer"],
    responses={401: {"model": ErrorBody}, 403: {"model": ErrorBody}, 429: {"model": ErrorBody}},
)


@router.get("/rollouts", response_model=list[AcceptedRollouts])
async def accepted_rollouts(
    request: Request,
    ctx: Ctx,
    signed: Signed,
    ledger: LedgerDep,
    run: Annotated[str, Query(max_length=64)],
    after: Annotated[int, Query(ge=0, le=INT32_MAX)] = 0,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
    wait_s: Annotated[float, Query(ge=0, le=10)] = 0.0,
) -> list[AcceptedRollouts]:
    """Accepted submissions of ``run`` after cursor ``after``, in acceptance order; waits up to
    ``wait_s`` for the first, answering the moment a verdict accepts some."""
    deadline = time.monotonic() + wait_s
    entries = await ledger.run_signed(signed, training.accepted_after, run, after, limit, ledger.now())

    async def look() -> list[AcceptedRollouts]:
        # The signature and its nonce were checked and recorded by the first look.
        return await ledger.run(training.accepted_after, signed.address, run, after, limit, ledger.now())

    return await long_poll(request, entries, look, _on_work(ctx), bool, deadline)


@router.get(
    "/submissions/{submission_id}/file", responses={200: {"content": {"application/octet-stream": {}}}, 404: {"model": ErrorBody}}
)
async def accepted_file(submission_id: str, ctx: Ctx, signed: Signed, ledger: LedgerDep) -> Response:
    key = await ledger.run_signed(signed, training.accepted_file_key, submission_id)
    return await blob_response(ctx.blobs, key)


@router.post("/metrics", status_code=204, responses={404: {"model": ErrorBody}})
async def post_metrics(body: TrainerMetricsRequest, ctx: Ctx, signed: Signed, ledger: LedgerDep) -> None:
    """One policy step's summary (loss, rewards, lengths, clip fractions...) for the leaderboard;
    the step's timing is exported to Prometheus as it completes."""
    await ledger.run_signed(signed, training.record_metrics, body, ledger.now())
    for timing in await ledger.run(step_timing.step_timings, body.run_id, 1):
        ctx.metrics.record_step(body.run_id, timing)


@router.post("/islands/join", responses={404: {"model": ErrorBody}})
async def island_join(body: IslandJoin, signed: Signed, ledger: LedgerDep) -> dict[str, int]:
    """An island (re)starting: the submissions it claimed but never reported go back to the pool."""
    return {"released": await ledger.run_signed(signed, islands.join, body, ledger.now())}


@router.post("/islands/claim", response_model=list[AcceptedRollouts], responses={404: {"model": ErrorBody}})
async def island_claim(
    body: IslandClaim, request: Request, ctx: Ctx, signed: Signed, ledger: LedgerDep, settings: Settings
) -> list[AcceptedRollouts]:
    """Accepted submissions no island holds, now the caller's; waits up to ``wait_s`` for the first."""
    deadline = time.monotonic() + body.wait_s
    entries = await ledger.run_signed(signed, islands.claim, body, ledger.now(), settings.island_lease_s)

    async def look() -> list[AcceptedRollouts]:
        return await ledger.run(islands.claim, signed.address, body, ledger.now(), settings.island_lease_s)

    return await long_poll(request, entries, look, _on_work(ctx), bool, deadline)


@router.post(
    "/islands/claim-shards", response_model=ShardClaims, responses={404: {"model": ErrorBody}, 409: {"model": ErrorBody}}
)
async def island_claim_shards(
    body: IslandClaim, request: Request, ctx: Ctx, signed: Signed, ledger: LedgerDep, settings: Settings
) -> ShardClaims:
    """A pretraining run's shard slots no island holds, now the caller's; waits up to ``wait_s`` for the first
    while slots remain that others hold (one may come back)."""
    deadline = time.monotonic() + body.wait_s
    stake = None if ctx.stakes is None else await ctx.stakes.stake(signed.address)
    claims = await ledger.run_signed(signed, pretraining.claim_shards, body, ledger.now(), settings.island_lease_s, stake)

    async def look() -> ShardClaims:
        return await ledger.run(pretraining.claim_shards, signed.address, body, ledger.now(), settings.island_lease_s, stake)

    return await long_poll(request, claims, look, _on_work(ctx), lambda c: bool(c.slots) or not c.remaining, deadline)


@router.get(
    "/runs/{run_id}/shards/{sha256}",
    responses={200: {"content": {"application/octet-stream": {}}}, 404: {"model": ErrorBody}, 409: {"model": ErrorBody}},
)
async def corpus_shard(
    run_id: Annotated[str, Path(max_length=64)],
    sha256: Annotated[str, Path(pattern=r"^[0-9a-f]{64}$")],
    ctx: Ctx,
    signed: Signed,
    ledger: LedgerDep,
) -> Response:
    """A shard of a pretraining run's corpus, by its hash: the bytes the run was created with."""
    key = await ledger.run_signed(signed, pretraining.shard_blob, run_id, sha256)
    return await blob_response(ctx.blobs, key)


@router.post("/islands/report", status_code=204, responses={404: {"model": ErrorBody}, 409: {"model": ErrorBody}})
async def island_report(body: IslandReport, signed: Signed, ledger: LedgerDep) -> None:
    """The claims an island's pseudo-gradient for an outer step learned from; 409: stay out of the step."""
    await ledger.run_signed(signed, islands.report, body, ledger.now())


@router.post("/islands/vouch", status_code=204, responses={404: {"model": ErrorBody}, 409: {"model": ErrorBody}})
async def island_vouch(body: IslandVouch, signed: Signed, ledger: LedgerDep) -> None:
    """After a committed meeting: what the next policy step holds and which island publishes it (:mod:`coordinator.services.step_vouches`)."""
    await ledger.run_signed(signed, step_vouches.vouch, body, ledger.now())


@router.post("/islands/heal-check", status_code=204, responses={404: {"model": ErrorBody}, 409: {"model": ErrorBody}})
async def island_heal_check(body: IslandHealCheck, signed: Signed, ledger: LedgerDep, settings: Settings) -> None:
    """An island received a peer's state: 204 if it is the run's agreed state for the step, 409 if not."""
    await ledger.run_signed(signed, step_vouches.require_agreed, body, ledger.now(), settings.island_lease_s)


@router.post("/islands/settle", response_model=SettleReply, responses={404: {"model": ErrorBody}, 409: {"model": ErrorBody}})
async def island_settle(body: IslandSettle, signed: Signed, ledger: LedgerDep) -> SettleReply:
    """An outer step was published: the included islands' reported claims are consumed, the rest released, and in a
    pretraining run its audits drawn; 409 unless most of the islands that vouched for the step vouched for this
    record of it."""
    return await ledger.run_signed(signed, islands.settle, body, ledger.now())


@router.post(
    "/pseudo-gradients",
    status_code=204,
    responses={404: {"model": ErrorBody}, 409: {"model": ErrorBody}, 413: {"model": ErrorBody}},
)
async def pseudo_gradient(
    ctx: Ctx, run: Annotated[str, Query(max_length=64)], upload: SignedPseudoGradient, ledger: LedgerDep
) -> None:
    """The bytes (bf16, as the islands received them) of a pseudo-gradient drawn for audit; the signature covers their
    sha256, which must be the one the step's record holds (:mod:`coordinator.services.island_audits`)."""
    signed, staged = upload
    await asyncio.to_thread(ctx.blobs.put_file, island_audits.blob_key(run, staged.sha256), staged.path)
    await ledger.run_signed(signed, island_audits.record_upload, run, staged.sha256)
    ctx.work_arrived.notify()


def _on_work(ctx: Context) -> Callable[[object, float], Awaitable[None]]:
    """A long poll's wait: woken at once when work is accepted on this process, other replicas' within the timeout."""

    async def wait(_: object, timeout: float) -> None:
        await ctx.work_arrived.wait(timeout)

    return wait
