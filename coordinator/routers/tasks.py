"""Work for nodes: lease a task, upload its rollout file. Both signed by the node."""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import APIRouter, Query, Response

from intellect_protocol.coordinator.deps import Ctx, LedgerDep, Settings, Signed, SignedUpload
from intellect_protocol.coordinator.services import runs, submissions
from intellect_protocol.shared.schemas import ErrorBody, LeaseRequest, SubmissionReceipt, TaskSpec

router = APIRouter(prefix="/v1", tags=["tasks"], responses={401: {"model": ErrorBody}, 429: {"model": ErrorBody}})


@router.post(
    "/tasks/lease",
    response_model=TaskSpec,
    responses={
        204: {"description": "No new work now; X-Intellect-Wait says why, Retry-After when to ask again (WorkWait)."},
        403: {"model": ErrorBody},
        404: {"model": ErrorBody},
    },
)
async def lease(ctx: Ctx, body: LeaseRequest, signed: Signed, ledger: LedgerDep, settings: Settings) -> TaskSpec | Response:
    stakes = ctx.stakes
    stake = None if stakes is None else await stakes.stake(signed.address)
    leased = await ledger.run_signed(signed, runs.lease, body, settings, ledger.now(), stake)
    if isinstance(leased, TaskSpec):
        return leased
    headers = {
        "x-intellect-wait": leased.reason,
        "x-intellect-wait-message": leased.message,
        "retry-after": f"{leased.retry_after_s:.0f}",
    }
    return Response(status_code=204, headers=headers)


@router.post(
    "/submissions",
    response_model=SubmissionReceipt,
    responses={
        403: {"model": ErrorBody},
        404: {"model": ErrorBody},
        409: {"model": ErrorBody},
        413: {"model": ErrorBody},
        422: {"model": ErrorBody},
    },
)
async def submit(
    ctx: Ctx, task: Annotated[str, Query(max_length=64)], upload: SignedUpload, ledger: LedgerDep
) -> SubmissionReceipt:
    """Upload a rollout file (Parquet, the raw body) for a leased task; the signature covers its hash."""
    signed, staged = upload
    expected = await ledger.run(submissions.expected_file, signed.address, task, staged.sha256, ledger.now())
    rollouts = None
    if expected is not None:
        rollouts = await asyncio.to_thread(lambda: submissions.parse(staged.path.read_bytes(), expected))
        await asyncio.to_thread(ctx.blobs.put_file, expected.blob_key, staged.path)
    receipt = await ledger.run_signed(signed, submissions.record, task, staged.sha256, rollouts, ledger.now(), staged.started_at)
    ctx.work_arrived.notify()
    return receipt
