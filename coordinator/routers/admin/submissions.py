"""Admin: submissions (list with filters, detail, invalidate)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Query
from sqlalchemy.orm import Session

from intellect_protocol.coordinator.deps import LedgerDep, Settings
from intellect_protocol.coordinator.routers.admin.common import CONFLICT, NOT_FOUND, OperateToken, Reader, admin_router, audited
from intellect_protocol.coordinator.routers.admin.nodes import Reason
from intellect_protocol.coordinator.services import receipts, validation
from intellect_protocol.shared.committee import AdminReceipt, PublicReceipt
from intellect_protocol.shared.schemas import INT32_MAX, Address, UtcTime
from intellect_protocol.shared.states import SubmissionStatus

router = admin_router("submissions")


@router.get("/submissions", response_model=list[AdminReceipt], dependencies=[Reader])
async def list_submissions(
    ledger: LedgerDep,
    run_id: Annotated[str | None, Query(max_length=64)] = None,
    status: SubmissionStatus | None = None,
    address: Address | None = None,
    since: UtcTime | None = None,
    until: UtcTime | None = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    offset: Annotated[int, Query(ge=0, le=INT32_MAX)] = 0,
) -> list[AdminReceipt]:
    """Submissions, newest first, filtered by run, status, node and upload time [since, until)."""
    filters = receipts.SubmissionFilter(run_id=run_id, status=status, address=address, since=since, until=until)
    return await ledger.run(receipts.admin_receipts, filters, limit, offset)


@router.get("/submissions/{submission_id}", response_model=AdminReceipt, dependencies=[Reader], responses=NOT_FOUND)
async def get_submission(submission_id: str, ledger: LedgerDep) -> AdminReceipt:
    """The public receipt plus what only operators see: the file's hash and blob key, sizes, the claim."""
    return await ledger.run(receipts.admin_receipt, submission_id)


@router.post("/submissions/{submission_id}/invalidate", response_model=PublicReceipt, responses=CONFLICT)
async def invalidate_submission(
    submission_id: str, body: Reason, ledger: LedgerDep, settings: Settings, token: OperateToken
) -> PublicReceipt:
    """Find accepted work invalid after the fact: its credit (even final) is clawed back and the node takes a strike."""

    def work(session: Session) -> PublicReceipt:
        validation.invalidate(session, submission_id, body.reason, settings, ledger.now())
        session.flush()
        return receipts.public_receipt(session, submission_id)

    return await audited(ledger, token, "submissions.invalidate", submission_id, work, reason=body.reason)
