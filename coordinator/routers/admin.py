"""Operator endpoints under /v1/admin, behind bearer tokens with scopes."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy.orm import Session

from coordinator.deps import LedgerDep, Settings, require_admin
from coordinator.models import AdminToken, Node, NodeStatusEvent
from coordinator.services import nodes, roles, shardcast, validation
from shared.schemas import Address, ErrorBody, NodeStatus, PublicReceipt, RelayInfo, RoleName

router = APIRouter(prefix="/v1/admin", tags=["admin"], responses={401: {"model": ErrorBody}, 403: {"model": ErrorBody}})
Reader = Depends(require_admin("read"))
Operator = Depends(require_admin("operate"))


class NodeOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    address: str
    operator_address: str | None
    status: NodeStatus
    ban_reason: str | None
    client_version: str
    specs: dict[str, Any]
    first_seen: datetime
    last_seen: datetime
    last_heartbeat_at: datetime | None
    last_heartbeat: dict[str, Any] | None


class StatusEventOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    from_status: NodeStatus | None
    to_status: NodeStatus
    reason: str
    at: datetime


class NodeList(BaseModel):
    counts: dict[NodeStatus, int]
    nodes: list[NodeOut]


class NodeDetail(NodeOut):
    events: list[StatusEventOut]


class Reason(BaseModel):
    model_config = ConfigDict(extra="forbid")
    reason: str = Field(min_length=1, max_length=1000)


def _detail(session: Session, node: Node) -> NodeDetail:
    events: list[NodeStatusEvent] = nodes.recent_events(session, node.address, limit=50)
    return NodeDetail(**NodeOut.model_validate(node).model_dump(), events=[StatusEventOut.model_validate(e) for e in events])


@router.get("/nodes", response_model=NodeList, dependencies=[Reader])
async def list_nodes(
    ledger: LedgerDep,
    status: NodeStatus | None = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    offset: Annotated[int, Query(ge=0)] = 0,
) -> NodeList:
    def read(session: Session) -> NodeList:
        return NodeList(
            counts=nodes.status_counts(session),
            nodes=[NodeOut.model_validate(n) for n in nodes.list_nodes(session, status, limit, offset)],
        )

    return await ledger.run(read)


@router.get("/nodes/{address}", response_model=NodeDetail, dependencies=[Reader], responses={404: {"model": ErrorBody}})
async def get_node(address: Address, ledger: LedgerDep) -> NodeDetail:
    return await ledger.run(lambda session: _detail(session, nodes.get_node(session, address)))


@router.post(
    "/nodes/{address}/ban",
    response_model=NodeDetail,
    dependencies=[Operator],
    responses={404: {"model": ErrorBody}, 409: {"model": ErrorBody}},
)
async def ban_node(address: Address, body: Reason, ledger: LedgerDep) -> NodeDetail:
    return await ledger.run(lambda session: _detail(session, nodes.ban(session, address, body.reason, datetime.now(UTC))))


@router.post(
    "/nodes/{address}/unban",
    response_model=NodeDetail,
    dependencies=[Operator],
    responses={404: {"model": ErrorBody}, 409: {"model": ErrorBody}},
)
async def unban_node(address: Address, body: Reason, ledger: LedgerDep) -> NodeDetail:
    return await ledger.run(lambda session: _detail(session, nodes.unban(session, address, body.reason, datetime.now(UTC))))


class RoleGrant(BaseModel):
    model_config = ConfigDict(extra="forbid")
    address: Address
    role: RoleName


class RoleOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)
    address: str
    role: RoleName
    granted_by: str
    granted_at: datetime
    revoked_at: datetime | None


class RelayOut(RelayInfo):
    registered_at: datetime
    reports: int
    """Reports from clients naming this relay's URL (bad chunks, failures)."""


@router.get("/roles", response_model=list[RoleOut], dependencies=[Reader])
async def list_roles(ledger: LedgerDep) -> list[RoleOut]:
    return [RoleOut.model_validate(r) for r in await ledger.run(roles.active_roles)]


@router.post("/roles", response_model=RoleOut, status_code=201)
async def grant_role(body: RoleGrant, ledger: LedgerDep, token: Annotated[AdminToken, Depends(require_admin("admin"))]) -> RoleOut:
    """Grant ``validator``, ``trainer`` or ``relay`` to an address (idempotent)."""
    row = await ledger.run(roles.grant, body.address, body.role, f"token:{token.name}", datetime.now(UTC))
    return RoleOut.model_validate(row)


@router.delete(
    "/roles/{address}/{role}",
    response_model=RoleOut,
    dependencies=[Depends(require_admin("admin"))],
    responses={404: {"model": ErrorBody}},
)
async def revoke_role(address: Address, role: RoleName, ledger: LedgerDep) -> RoleOut:
    return RoleOut.model_validate(await ledger.run(roles.revoke, address, role, datetime.now(UTC)))


@router.get("/relays", response_model=list[RelayOut], dependencies=[Reader])
async def list_relays(ledger: LedgerDep) -> list[RelayOut]:
    """Every relay that registered: URL, last seen, and how many bad-chunk or failure reports name it."""
    rows = await ledger.run(shardcast.all_relays)
    return [
        RelayOut(address=r.address, url=r.url, kind=r.kind, last_seen=r.last_seen, registered_at=r.registered_at, reports=n)
        for r, n in rows
    ]


@router.post(
    "/submissions/{submission_id}/invalidate",
    response_model=PublicReceipt,
    dependencies=[Operator],
    responses={404: {"model": ErrorBody}, 409: {"model": ErrorBody}},
)
async def invalidate_submission(submission_id: str, body: Reason, ledger: LedgerDep, settings: Settings) -> PublicReceipt:
    """Find accepted work invalid after the fact: its credit is clawed back and the node takes a strike."""

    def work(session: Session) -> PublicReceipt:
        validation.invalidate(session, submission_id, body.reason, settings, datetime.now(UTC))
        session.flush()
        return validation.public_receipt(session, submission_id)

    return await ledger.run(work)
