"""Work for nodes: lease a task, upload its rollout file. Both signed by the node."""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import APIRouter, Query, Response
from sqlalchemy.orm import Session

from intellect_protocol.coordinator.deps import Ctx, LedgerDep, Settings, Signed, SignedUpload
from intellect_protocol.coordinator.errors import ApiError
from intellect_protocol.coordinator.services import plugin_failures, runs, submissions, validation
from intellect_protocol.shared.environments.bounded import PluginFailure
from intellect_protocol.shared.plugin_schemas import PluginFailureAnswer, PluginFailureReport
from intellect_protocol.shared.schemas import ErrorBody, ErrorCode, LeaseRequest, SubmissionReceipt, TaskSpec

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
    ctx: Ctx, task: Annotated[str, Query(max_length=64)], upload: SignedUpload, ledger: LedgerDep, settings: Settings
) -> SubmissionReceipt:
    """Upload a rollout file (Parquet, the raw body) for a leased task; the signature covers its hash."""
    signed, staged = upload
    expected = await ledger.run(submissions.expected_file, signed.address, task, staged.sha256, ledger.now())
    rollouts = None
    if expected is not None:
        rollouts = await asyncio.to_thread(lambda: submissions.parse(staged.path.read_bytes(), expected))
        await asyncio.to_thread(ctx.blobs.put_file, expected.blob_key, staged.path)
    now = ledger.now()

    def work(session: Session, signer: str) -> tuple[SubmissionReceipt, set[str]]:
        receipt = submissions.record(session, signer, task, staged.sha256, rollouts, now, staged.started_at)
        session.flush()
        return receipt, validation.assign_arrived(session, settings, now)

    receipt, drawn = await ledger.run_signed(signed, work)
    ctx.validators_waiting.notify(drawn)
    return receipt


@router.post(
    "/tasks/plugin-failure",
    response_model=PluginFailureAnswer,
    responses={404: {"model": ErrorBody}, 409: {"model": ErrorBody}, 422: {"model": ErrorBody}},
)
async def plugin_failure(
    ctx: Ctx, body: PluginFailureReport, signed: Signed, ledger: LedgerDep, settings: Settings
) -> PluginFailureAnswer:
    """The run's reward failed on a completion of a task this node holds: run here on the same text, and if it
    fails here too the task goes back and the run counts the failure (paused past a bound); 409
    ``plugin_works_here`` if it scores it (:mod:`coordinator.services.plugin_failures`)."""
    environment, pin, problem = await ledger.run_signed(signed, plugin_failures.reported, body, ledger.now())
    try:
        value = await asyncio.to_thread(ctx.rewards_of(environment, pin).task_reward, body.completion, problem)
    except PluginFailure as e:
        return await ledger.run(plugin_failures.record, signed.address, body, e.message, settings, ledger.now())
    raise ApiError(
        ErrorCode.plugin_works_here,
        f"The run's reward scores this completion {value:g} on the coordinator: the failure is this node's own "
        f"(its install of {environment!r} differs, or it ran out of time or memory); the task stays leased to it.",
    )
