"""Nodes: registration, heartbeats, bans, and the status state machine.

::

    registered ──heartbeat──► healthy ◄──heartbeat── unhealthy ──silence──► dead
         │                      │  ▲                     ▲                  │
         └─────silence──────────┴──┼─────silence─────────┘                  │
                                   └────────────────heartbeat───────────────┘
    any status but banned ──ban──► banned ──unban──► unhealthy

Every transition writes a :class:`NodeStatusEvent` row in the same transaction.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta

from packaging.version import Version
from sqlalchemy import bindparam, func, select, update
from sqlalchemy.orm import Session

from intellect_protocol.coordinator import events
from intellect_protocol.coordinator.errors import ApiError
from intellect_protocol.coordinator.models import Node, NodeStatusEvent, NodeStrike, Task
from intellect_protocol.coordinator.settings import CoordinatorSettings
from intellect_protocol.shared.links import link_signer
from intellect_protocol.shared.schemas import ErrorCode, HeartbeatRequest, NodeStatus, RegisterRequest
from intellect_protocol.shared.states import TaskStatus

STRIKES_BAN = "strikes (forged or corrupted work, or repeated wrong work)"
"""The end of the ban reason of a node banned by its strikes (the settlement slashes those bans)."""

S = NodeStatus
TRANSITIONS: dict[NodeStatus | None, set[NodeStatus]] = {
    None: {S.registered},
    S.registered: {S.healthy, S.unhealthy, S.dead, S.banned},
    S.healthy: {S.unhealthy, S.dead, S.banned},
    S.unhealthy: {S.healthy, S.dead, S.banned},
    S.dead: {S.healthy, S.banned},
    S.banned: {S.unhealthy},
}
SILENCE_WATCHED = (S.registered, S.healthy, S.unhealthy)


def transition(session: Session, node: Node, to: NodeStatus, reason: str, now: datetime) -> None:
    current = NodeStatus(node.status) if node.status else None
    if to not in TRANSITIONS[current]:
        raise ValueError(f"illegal node status transition {current} -> {to}")
    session.add(NodeStatusEvent(address=node.address, from_status=current, to_status=to, reason=reason, at=now))
    node.status = to
    node.status_changed_at = now


def check_version(client_version: str, settings: CoordinatorSettings) -> None:
    if Version(client_version) < Version(settings.min_node_version):
        raise ApiError(
            ErrorCode.version_unsupported,
            f"Node client {client_version} is older than the oldest this coordinator accepts ({settings.min_node_version}).",
            {"min_node_version": settings.min_node_version},
        )


def register(
    session: Session,
    signer: str,
    body: RegisterRequest,
    settings: CoordinatorSettings,
    now: datetime,
    audience: str,
    admit_new: Callable[[], None] | None = None,
) -> Node:
    """Create the node, or refresh its specs when it registers again (idempotent per address).
    ``admit_new``, when given, is called before a new address is created and raises to refuse it
    (the API passes the client IP's registration allowance). An operator link is kept only with
    the operator's signature of it (:mod:`shared.links`)."""
    check_version(body.client_version, settings)
    _require_signed_link(body, signer, audience)
    node = session.get(Node, signer)
    if node is not None and node.status == S.banned:
        raise banned_error(session, node)
    if node is None:
        if admit_new is not None:
            admit_new()
        node = Node(address=signer, first_seen=now, status=None)
        session.add(node)
        transition(session, node, S.registered, "registered", now)
    node.operator_address, node.operator_signature = (
        body.operator_address,
        body.operator_signature if body.operator_address else None,
    )
    node.specs = body.specs.model_dump()
    node.client_version = body.client_version
    node.last_seen = now
    return node


def _require_signed_link(body: RegisterRequest, node: str, audience: str) -> None:
    if body.operator_address is None:
        return
    if body.operator_signature is None or link_signer(body.operator_signature, audience, node) != body.operator_address:
        raise ApiError(
            ErrorCode.body_signature_invalid,
            f"operator_address {body.operator_address} needs that operator's signature of the link to this node on this deployment "
            "(operator_signature; the operator makes it with `intellect-node link-operator`).",
        )


_HEARTBEAT = (
    update(Node)
    .where(Node.address == bindparam("node"))
    .values(
        last_seen=bindparam("now"),
        last_heartbeat_at=bindparam("now"),
        last_heartbeat=bindparam("heartbeat"),
        client_version=bindparam("version"),
    )
    .returning(Node.status, Node.ban_reason)
)


def heartbeat(
    session: Session, signer: str, body: HeartbeatRequest, settings: CoordinatorSettings, now: datetime
) -> tuple[NodeStatus, str | None]:
    """Record a heartbeat; a silent node that speaks again becomes healthy at once.

    Returns the node's status and, when banned, :func:`ban_notice`. The common case is one prepared
    UPDATE ... RETURNING on the connection: this is the coordinator's hottest statement.
    """
    check_version(body.client_version, settings)
    params = {
        "node": signer,
        "now": now,
        "heartbeat": {"activity": body.activity, "metrics": body.metrics, "weights": body.weights},
        "version": body.client_version,
    }
    session.flush()  # the statement bypasses the ORM, so pending ORM changes must reach the database first
    status, ban_reason = session.connection().execute(_HEARTBEAT, params).one_or_none() or (None, None)
    if status is None:
        raise ApiError(ErrorCode.node_not_registered, "This address has not registered; call /v1/nodes/register first.")
    if status in (S.registered, S.unhealthy, S.dead):
        node = session.get_one(Node, signer)
        transition(session, node, S.healthy, "heartbeat", now)
        status = S.healthy
    return NodeStatus(status), ban_notice(session, signer, ban_reason) if status == S.banned else None


def ban(session: Session, address: str, reason: str, now: datetime) -> Node:
    """Ban the node and end its leases at once: a file it is still making would be refused at upload
    (:func:`submissions.record` checks the lease again), so its tasks go to other nodes now."""
    node = get_node(session, address)
    if node.status == S.banned:
        raise ApiError(ErrorCode.conflict, "This node is already banned.")
    transition(session, node, S.banned, f"banned: {reason}", now)
    node.ban_reason = reason
    events.after_commit(session, "node %s banned: %s", address, reason)
    session.execute(
        update(Task)
        .where(Task.status == TaskStatus.leased, Task.leased_to == address)
        .values(status=TaskStatus.open, leased_to=None, lease_expires_at=None)
    )
    return node


def struck_submissions(session: Session, address: str) -> list[str]:
    """The submissions whose strikes against ``address`` still count (not taken back on appeal)."""
    struck = select(NodeStrike.submission_id).where(NodeStrike.address == address, NodeStrike.submission_id.is_not(None))
    counting = struck.group_by(NodeStrike.submission_id).having(func.sum(NodeStrike.units) > 0)
    return [s for s in session.scalars(counting) if s]


def ban_notice(session: Session, address: str, reason: str | None) -> str:
    """Why the node is banned, by whom, and what it can do, as a phrase after "This node is"."""
    if (reason or "").endswith(STRIKES_BAN):
        cited = ", ".join(struck_submissions(session, address)) or "none left"
        return (
            f"banned automatically, for {reason}, by the validators' verdicts on its submissions {cited}. "
            "`intellect-node receipts` shows each check and why; a rejection can be appealed within its dispute "
            "window (`intellect-node appeal ID`)"
        )
    return f"banned by the coordinator's operator: {reason}. Contact them to appeal"


def banned_error(session: Session, node: Node) -> ApiError:
    notice = ban_notice(session, node.address, node.ban_reason)
    return ApiError(ErrorCode.node_banned, f"This node is {notice}.", {"reason": node.ban_reason, "notice": notice})


def unban(session: Session, address: str, reason: str, now: datetime) -> Node:
    node = get_node(session, address)
    if node.status != S.banned:
        raise ApiError(ErrorCode.conflict, "This node is not banned.")
    # Unhealthy, not healthy: it has to heartbeat to prove it is alive.
    transition(session, node, S.unhealthy, f"unbanned: {reason}", now)
    node.ban_reason = None
    return node


def get_node(session: Session, address: str) -> Node:
    node = session.get(Node, address)
    if node is None:
        raise ApiError(ErrorCode.not_found, f"No node with address {address}.")
    return node


def recent_events(session: Session, address: str, limit: int) -> list[NodeStatusEvent]:
    query = select(NodeStatusEvent).where(NodeStatusEvent.address == address).order_by(NodeStatusEvent.id.desc())
    return list(session.scalars(query.limit(limit)))


def list_nodes(session: Session, status: NodeStatus | None, limit: int, offset: int, search: str | None = None) -> list[Node]:
    query = select(Node).order_by(Node.first_seen, Node.address)
    if status is not None:
        query = query.where(Node.status == status)
    if search:
        query = query.where(func.lower(Node.address).contains(search.lower(), autoescape=True))
    return list(session.scalars(query.limit(limit).offset(offset)))


def status_counts(session: Session) -> dict[NodeStatus, int]:
    counts = dict.fromkeys(NodeStatus, 0)
    for status, count in session.execute(select(Node.status, func.count()).group_by(Node.status)):
        counts[NodeStatus(status)] = count
    return counts


def evaluate_statuses(session: Session, settings: CoordinatorSettings, now: datetime) -> int:
    """Move silent nodes to unhealthy or dead; returns how many changed.

    Rows are locked with ``SKIP LOCKED`` so coordinator replicas sharing a PostgreSQL
    database never evaluate the same node twice (SQLite serialises writers anyway).
    """
    interval = timedelta(seconds=settings.heartbeat_interval_s)
    unhealthy_before = now - interval * (1 + settings.unhealthy_after_missed)
    dead_before = now - interval * (1 + settings.dead_after_missed)
    query = (
        select(Node).where(Node.status.in_(SILENCE_WATCHED), Node.last_seen < unhealthy_before).with_for_update(skip_locked=True)
    )
    changed = 0
    for node in session.scalars(query):
        silent_s = (now - node.last_seen).total_seconds()
        if node.last_seen < dead_before:
            transition(session, node, S.dead, f"no heartbeat for {silent_s:.0f} s", now)
            changed += 1
        elif node.status != S.unhealthy:
            transition(session, node, S.unhealthy, f"no heartbeat for {silent_s:.0f} s", now)
            changed += 1
    return changed
