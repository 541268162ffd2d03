"""Admin: nodes (list with filters and status counts, detail, ban and unban)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import Query
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy.orm import Session

from intellect_protocol.coordinator.deps import LedgerDep
from intellect_protocol.coordinator.models import Node
from intellect_protocol.coordinator.routers.admin.common import CONFLICT, NOT_FOUND, OperateToken, Reader, admin_router, audited
from intellect_protocol.coordinator.services import nodes, receipts
from intellect_protocol.shared.committee import PublicReceipt
from intellect_protocol.shared.schemas import INT32_MAX, Address, NodeStatus

router = admin_router("nodes")


class NodeOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    address: str
    operator_address: str | None
    status: NodeStatus
    ban_reason: str | None
    strikes: int
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
    """Nodes per status, over the whole network (not only this page)."""
    nodes: list[NodeOut]


class NodeDetail(NodeOut):
    events: list[StatusEventOut]
    """The newest 50 status transitions (heartbeats after silence, bans, ...), newest first."""
    recent_submissions: list[PublicReceipt]
    """The newest 20 submissions with their verdicts."""


class Reason(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"reason": "forged TOPLOC proofs in 3 uploads"}]})
    reason: str = Field(min_length=1, max_length=1000)
    """Why; kept in the node's history and the audit log."""


def _detail(session: Session, node: Node) -> NodeDetail:
    return NodeDetail(
        **NodeOut.model_validate(node).model_dump(),
        events=[StatusEventOut.model_validate(e) for e in nodes.recent_events(session, node.address, limit=50)],
        recent_submissions=receipts.receipts_of(session, node.address, 20),
    )


@router.get("/nodes", response_model=NodeList, dependencies=[Reader])
async def list_nodes(
    ledger: LedgerDep,
    status: NodeStatus | None = None,
    search: Annotated[str | None, Query(max_length=42, description="Part of the address, any case.")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    offset: Annotated[int, Query(ge=0, le=INT32_MAX)] = 0,
) -> NodeList:
    def read(session: Session) -> NodeList:
        found = nodes.list_nodes(session, status, limit, offset, search)
        return NodeList(counts=nodes.status_counts(session), nodes=[NodeOut.model_validate(n) for n in found])

    return await ledger.run(read)


@router.get("/nodes/{address}", response_model=NodeDetail, dependencies=[Reader], responses=NOT_FOUND)
async def get_node(address: Address, ledger: LedgerDep) -> NodeDetail:
    return await ledger.run(lambda session: _detail(session, nodes.get_node(session, address)))


@router.post("/nodes/{address}/ban", response_model=NodeDetail, responses=CONFLICT)
async def ban_node(address: Address, body: Reason, ledger: LedgerDep, token: OperateToken) -> NodeDetail:
    """Ban a node: its heartbeats are answered with ``stop`` and it can neither lease nor register."""

    def work(session: Session) -> NodeDetail:
        return _detail(session, nodes.ban(session, address, body.reason, ledger.now()))

    return await audited(ledger, token, "nodes.ban", address, work, reason=body.reason)


@router.post("/nodes/{address}/unban", response_model=NodeDetail, responses=CONFLICT)
async def unban_node(address: Address, body: Reason, ledger: LedgerDep, token: OperateToken) -> NodeDetail:
    def work(session: Session) -> NodeDetail:
        return _detail(session, nodes.unban(session, address, body.reason, ledger.now()))

    return await audited(ledger, token, "nodes.unban", address, work, reason=body.reason)
