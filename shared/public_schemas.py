"""Wire schemas of the public leaderboard: nodes' standing and credit, the network at a glance."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel

from intellect_protocol.shared.run_schemas import RunInfo
from intellect_protocol.shared.schemas import NodeStatus, WorkWait


class Credit(BaseModel):
    address: str
    pending: int
    """Credit micro-units (:mod:`shared.money`) still inside the dispute window (they can be clawed back)."""
    final: int
    """Credit micro-units past the dispute window."""


class LeaderboardRow(BaseModel):
    """One node's standing: ranked by final credit, then pending."""

    rank: int
    address: str
    status: NodeStatus
    final_credit: int
    """Credit micro-units (:mod:`shared.money`)."""
    pending_credit: int
    """Still inside the dispute window: a clawback can cancel it."""
    accepted_tokens: int
    accepted: int
    rejected: int
    """Rejected or invalidated submissions."""
    acceptance_rate: float | None
    """accepted / (accepted + rejected); None before the first verdict."""
    last_seen: datetime


class NetworkStatus(BaseModel):
    """The network at a glance, for the leaderboard page's status panel."""

    run: RunInfo | None
    """The newest active run, the one the numbers below are about (None: no run yet)."""
    policy_step: int
    nodes: dict[NodeStatus, int]
    nodes_online: int
    """Healthy nodes: they heartbeated within the last few intervals."""
    rollouts_per_minute: float
    """Sequences uploaded per minute over the last five minutes or, when the first of them came later,
    since that upload (at least a minute): the rate the throughput chart draws, not diluted by time
    before anything was uploaded."""
    validation_backlog: int
    """Submissions waiting for a validator."""
    rejection_rate: float | None
    """Share of verdicts that rejected (or later invalidated) the work; None before the first verdict."""
    relays: int
    """Relays seen recently."""
    work: WorkWait | None = None
    """Why nodes get no new work of the run now (waiting for validators, no trainer...); None: they do."""
    learning_stalled: str | None = None
    """One sentence when the run's accepted work has no reward spread for GRPO to learn from (work still goes
    out, and teaches nothing): :attr:`~shared.run_schemas.LearningSignal.stalled`."""
    server_time: datetime


class ThroughputBucket(BaseModel):
    start: datetime
    rollouts: int
    """Sequences uploaded in this bucket."""
    accepted_tokens: int
    """Generated tokens of submissions uploaded in this bucket and accepted since."""


class PublicNode(BaseModel):
    address: str
    status: NodeStatus
    first_seen: datetime
    last_seen: datetime
    credit: Credit
    submissions: dict[str, int]
    """Counts by status."""
