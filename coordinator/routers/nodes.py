"""Node endpoints: every request is signed by the node's own wallet."""

from __future__ import annotations

import time

from fastapi import APIRouter

from intellect_protocol.coordinator.deps import Ctx, LedgerDep, RegistrationGate, Settings, Signed
from intellect_protocol.coordinator.services import nodes, runs
from intellect_protocol.shared.schemas import (
    ErrorBody,
    HeartbeatRequest,
    HeartbeatResponse,
    NodeStatus,
    RegisterRequest,
    RegisterResponse,
)

router = APIRouter(prefix="/v1/nodes", tags=["nodes"], responses={401: {"model": ErrorBody}, 429: {"model": ErrorBody}})


@router.post(
    "/register",
    response_model=RegisterResponse,
    responses={403: {"model": ErrorBody}, 422: {"model": ErrorBody}, 426: {"model": ErrorBody}},
)
async def register(
    body: RegisterRequest, ctx: Ctx, signed: Signed, ledger: LedgerDep, settings: Settings, gate: RegistrationGate
) -> RegisterResponse:
    """Register this node (again: its specs are refreshed). An ``operator_address`` needs that
    operator's ``operator_signature`` of the link (``intellect-node link-operator``); else 422."""
    node = await ledger.run_signed(signed, nodes.register, body, settings, ledger.now(), ctx.audience, gate)
    return RegisterResponse(
        address=node.address,
        status=NodeStatus(node.status),
        first_seen=node.first_seen,
        heartbeat_interval_s=settings.heartbeat_interval_s,
    )


@router.post("/heartbeat", response_model=HeartbeatResponse, responses={404: {"model": ErrorBody}, 426: {"model": ErrorBody}})
async def heartbeat(body: HeartbeatRequest, ctx: Ctx, signed: Signed, ledger: LedgerDep, settings: Settings) -> HeartbeatResponse:
    status, ban_reason = await ledger.run_signed(signed, nodes.heartbeat, body, settings, ledger.now())
    banned = status == NodeStatus.banned
    return HeartbeatResponse(
        action="stop" if banned else "continue",
        status=status,
        reason=ban_reason if banned else None,
        heartbeat_interval_s=settings.heartbeat_interval_s,
        # Read at most once a second, however many nodes beat: heartbeats are the hottest path.
        policy_steps={} if banned else await ctx.policy_steps.get(None, lambda: ledger.run(runs.policy_steps)),
        server_time=time.time(),
    )
