"""Wire schemas of pretraining islands' audits (:mod:`coordinator.services.island_audits`): what a validator is given
to replay, what it answers, and where an audit stands."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field

from intellect_protocol.shared.island_schemas import ShardSlot
from intellect_protocol.shared.schemas import Address, Request
from intellect_protocol.shared.shardcast.chunking import Hex64
from intellect_protocol.shared.states import AuditState

MAX_ERROR = 1e9
"""The largest relative error a verdict carries (JSON has no infinity): a pseudo-gradient of the wrong size or not finite."""


class IslandAuditTask(BaseModel):
    """An uploaded pseudo-gradient for validators to replay (:func:`shared.pretraining.audit.replay`)."""

    id: int
    run_id: str
    outer_step: int
    """The meeting it was sent to."""
    start_step: int
    """The policy step whose weights its inner steps started from: ``outer_step``, or in a run whose meetings overlap
    the next round (:attr:`~shared.island_schemas.OuterSettings.overlap`) the one before (0 at least)."""
    island: str
    digest: Hex64
    slots: list[ShardSlot]
    """The slots the island reported for the step, in the order it learnt them."""
    start_audit: int | None = None
    """An overlapped round started from policy step ``start_step``'s weights minus the island's pseudo-gradient of the
    step before: that audit's (:meth:`~shared.coordinator_client.CoordinatorClient.island_audit_file`)."""


class IslandAuditVerdict(Request):
    """A validator's replay of an audit: how far what the island sent is from it. Whether that passes is the run's
    tolerance's to say, at the coordinator."""

    address: Address
    relative_error: float = Field(ge=0, le=MAX_ERROR)
    cosine: float = Field(ge=-1.0001, le=1.0001)


class IslandAuditInfo(BaseModel):
    """Where an audit stands (the answer to a verdict)."""

    id: int
    run_id: str
    outer_step: int
    island: str
    state: AuditState
    votes: int
    """Verdicts recorded; the run's ``audit_votes`` decide it."""
    outcome: str | None
    decided_at: datetime | None
