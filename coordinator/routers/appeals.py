"""Appeals (signed by the node that submitted the work): have a rejection judged again by other validators."""

from __future__ import annotations

from fastapi import APIRouter

from intellect_protocol.coordinator.deps import LedgerDep, Settings, Signed
from intellect_protocol.coordinator.services import appeals
from intellect_protocol.shared.committee import AppealInfo, AppealRequest
from intellect_protocol.shared.schemas import ErrorBody

router = APIRouter(prefix="/v1/appeals", tags=["appeals"], responses={401: {"model": ErrorBody}, 429: {"model": ErrorBody}})


@router.post(
    "",
    response_model=AppealInfo,
    status_code=201,
    responses={403: {"model": ErrorBody}, 404: {"model": ErrorBody}, 409: {"model": ErrorBody}},
)
async def appeal(body: AppealRequest, signed: Signed, ledger: LedgerDep, settings: Settings) -> AppealInfo:
    """Appeal a rejection of your work within the dispute window: validators that had not judged it
    check it again, and their majority replaces the decision (credit and strikes follow). The
    submission's receipt shows the appeal and every verdict."""
    return await ledger.run_signed(signed, appeals.file, body, settings, ledger.now())
