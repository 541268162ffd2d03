"""Public, unauthenticated endpoints: what anyone may know about the network."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request

from coordinator.deps import LedgerDep, Settings, client_rate_limit
from coordinator.errors import ApiError
from coordinator.models import Run
from coordinator.services import credit, nodes, training, validation
from shared.schemas import Address, Credit, ErrorBody, ErrorCode, PublicReceipt, PublicStatus, RunInfo, RunProgress
from shared.version import __version__

router = APIRouter(prefix="/v1/public", tags=["public"], dependencies=[Depends(client_rate_limit)])


@router.get("/status", response_model=PublicStatus)
async def status(request: Request, ledger: LedgerDep, settings: Settings) -> PublicStatus:
    return PublicStatus(
        coordinator_version=__version__,
        min_node_version=settings.min_node_version,
        audience=request.app.state.audience,
        heartbeat_interval_s=settings.heartbeat_interval_s,
        signature_window_s=settings.signature_window_s,
        nodes=await ledger.run(nodes.status_counts),
        server_time=time.time(),
    )


@router.get("/time")
async def server_time() -> dict[str, float]:
    """The coordinator's clock, for nodes measuring their skew; touches no database."""
    return {"server_time": time.time()}


@router.get("/submissions", response_model=list[PublicReceipt])
async def node_receipts(address: Address, ledger: LedgerDep, limit: Annotated[int, Query(ge=1, le=500)] = 50) -> list[PublicReceipt]:
    """One node's newest receipts (what ``intellect-node receipts`` shows)."""
    return await ledger.run(validation.receipts_of, address, limit)


@router.get("/submissions/{submission_id}", response_model=PublicReceipt, responses={404: {"model": ErrorBody}})
async def submission_receipt(submission_id: str, ledger: LedgerDep) -> PublicReceipt:
    """A submission's public receipt: status, every check's result and reason, credit, validator."""
    return await ledger.run(validation.public_receipt, submission_id)


@router.get("/nodes/{address}/credit", response_model=Credit)
async def node_credit(address: Address, ledger: LedgerDep) -> Credit:
    """A node's credit: the sum of its ledger entries, pending and final."""
    pending, final = await ledger.run(credit.balance, address, datetime.now(UTC))
    return Credit(address=address, pending=pending, final=final)


@router.get("/runs/{run_id}", response_model=RunInfo, responses={404: {"model": ErrorBody}})
async def run_info(run_id: str, ledger: LedgerDep) -> RunInfo:
    def read(session) -> RunInfo:  # type: ignore[no-untyped-def]
        run = session.get(Run, run_id)
        if run is None:
            raise ApiError(404, ErrorCode.not_found, f"No run {run_id}.")
        return RunInfo.model_validate(run, from_attributes=True)

    return await ledger.run(read)


@router.get("/runs/{run_id}/progress", response_model=RunProgress, responses={404: {"model": ErrorBody}})
async def run_progress(run_id: str, ledger: LedgerDep) -> RunProgress:
    """A run's submissions by status and every policy step's training metrics (for dashboards and charts)."""

    def read(session) -> RunProgress:  # type: ignore[no-untyped-def]
        if session.get(Run, run_id) is None:
            raise ApiError(404, ErrorCode.not_found, f"No run {run_id}.")
        steps = [{"step": m.step, **m.metrics} for m in training.metrics_of(session, run_id)]
        return RunProgress(submissions=training.run_stats(session, run_id), steps=steps)

    return await ledger.run(read)
