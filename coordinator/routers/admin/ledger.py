"""Admin: the ledger export (CSV or JSON, by time range) and the audit log of admin actions."""

from __future__ import annotations

import csv
import io
from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import Query
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict

from intellect_protocol.coordinator.deps import LedgerDep
from intellect_protocol.coordinator.routers.admin.common import Reader, admin_router
from intellect_protocol.coordinator.services import audit, credit
from intellect_protocol.shared.schemas import UtcTime

router = admin_router("ledger and audit")
MAX_EXPORT = 100_000


class EntryOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    address: str
    submission_id: str
    kind: str
    """credit, clawback (negative units) or restore (a clawback or credit given back after a reversal)."""
    units: int
    """Credit micro-units (:mod:`shared.money`)."""
    reason: str
    created_at: datetime
    final_at: datetime
    """Pending until then: within the dispute window a clawback can still cancel it."""
    cause_id: str | None = None
    """For a clawback or restore, the submission whose decision caused it."""


class AuditOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    token_id: int
    token_name: str
    action: str
    target: str
    detail: dict[str, Any]
    at: datetime


@router.get(
    "/ledger",
    response_model=list[EntryOut],
    dependencies=[Reader],
    responses={200: {"content": {"text/csv": {"example": "id,address,submission_id,kind,units,reason,created_at,final_at\n"}}}},
)
async def export_ledger(
    ledger: LedgerDep,
    since: UtcTime | None = None,
    until: UtcTime | None = None,
    format: Literal["json", "csv"] = "json",
    limit: Annotated[int, Query(ge=1, le=MAX_EXPORT)] = MAX_EXPORT,
) -> Any:
    """Contribution entries created within [since, until), oldest first: ``format=csv`` for spreadsheets."""
    entries = [EntryOut.model_validate(e) for e in await ledger.run(credit.entries_between, since, until, limit)]
    if format == "json":
        return entries
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(EntryOut.model_fields))
    writer.writeheader()
    for entry in entries:
        writer.writerow(entry.model_dump(mode="json"))
    return Response(out.getvalue(), media_type="text/csv", headers={"content-disposition": 'attachment; filename="ledger.csv"'})


@router.get("/audit", response_model=list[AuditOut], dependencies=[Reader])
async def audit_log(
    ledger: LedgerDep,
    since: UtcTime | None = None,
    until: UtcTime | None = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 500,
) -> list[AuditOut]:
    """Every admin action that changed something (which token, what, to what, when), newest first."""
    return [AuditOut.model_validate(e) for e in await ledger.run(audit.entries, since, until, limit)]
