"""Validators (role ``validator``): claim pending submissions, fetch their files, post verdicts; replay pretraining
islands' audited steps. All signed."""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, Path, Query, Request, Response
from sqlalchemy.orm import Session

from intellect_protocol.coordinator.blob_response import blob_response
from intellect_protocol.coordinator.deps import Ctx, LedgerDep, Settings, Signed
from intellect_protocol.coordinator.services import island_audits, receipts, validation
from intellect_protocol.coordinator.wakeup import POLL_S, long_poll
from intellect_protocol.shared.committee import PublicReceipt
from intellect_protocol.shared.island_audit_schemas import IslandAuditInfo, IslandAuditTask, IslandAuditVerdict
from intellect_protocol.shared.schemas import Claim, ClaimRequest, ErrorBody, VerdictRequest

router = APIRouter(
    prefix="/v1/validation",
    tags=["validation"],
    responses={401: {"model": ErrorBody}, 403: {"model": ErrorBody}, 429: {"model": ErrorBody}},
)


@router.post("/claim", response_model=list[Claim])
async def claim(
    body: ClaimRequest, request: Request, ctx: Ctx, signed: Signed, ledger: LedgerDep, settings: Settings
) -> list[Claim]:
    """The submissions drawn for this validator to judge (up to ``limit``, the policy closest to
    going stale first), each leased until ``claim_expires_at``; waits up to ``wait_s`` for some,
    then an empty list. Validators cannot choose."""
    # The first look marks the validator live; the wait never outlasts half of what keeps it so.
    deadline = time.monotonic() + min(body.wait_s, settings.committee.validator_live_s / 2)
    stakes = ctx.stakes
    stake = None if stakes is None else await stakes.stake(signed.address)
    drawn = await ledger.run_signed(signed, validation.claim, body, settings, ledger.now(), ctx.newcomer_reviews, stake)
    ctx.validators_waiting.notify(drawn.validators)

    async def look() -> validation.Drawn:
        # The signature, its nonce, the role and the stake were checked by the first look.
        again = await ledger.run(validation.draw, signed.address, body.limit, settings, ledger.now(), ctx.newcomer_reviews)
        ctx.validators_waiting.notify(again.validators)
        return again

    async def wait(drawn: validation.Drawn, timeout: float) -> None:
        # Woken at once when work is drawn for us on this process (as it arrives, or by another validator's look);
        # other replicas' draws show within POLL_S; a newcomer's file held back is looked at again when its turn comes.
        await ctx.validators_waiting.wait(signed.address, min(timeout, drawn.newcomers_in_s or POLL_S))

    return (await long_poll(request, drawn, look, wait, lambda d: bool(d.claims), deadline)).claims


@router.get(
    "/submissions/{submission_id}/file",
    responses={200: {"content": {"application/octet-stream": {}}}, 404: {"model": ErrorBody}, 409: {"model": ErrorBody}},
)
async def submission_file(submission_id: str, ctx: Ctx, signed: Signed, ledger: LedgerDep) -> Response:
    """The rollout file of a submission this validator holds a live assignment to judge."""
    submission, _ = await ledger.run_signed(signed, validation.claimed, submission_id, ledger.now())
    return await blob_response(ctx.blobs, submission.blob_key)


@router.post("/verdicts", response_model=PublicReceipt, responses={404: {"model": ErrorBody}, 409: {"model": ErrorBody}})
async def verdict(body: VerdictRequest, ctx: Ctx, signed: Signed, ledger: LedgerDep, settings: Settings) -> PublicReceipt:
    """Record every check's result for an assigned submission, signed by the validator (see
    :mod:`shared.verdicts`); the submission is decided, or goes to another validator first."""
    audience = ctx.audience

    def work(session: Session, signer: str) -> tuple[PublicReceipt, set[str]]:
        submission = validation.record_verdict(session, signer, body, settings, ledger.now(), audience)
        session.flush()
        # An audit, second opinion or tie-break may have opened: drawn for now, its validator woken.
        return receipts.public_receipt(session, submission.id), validation.assign_arrived(session, settings, ledger.now())

    receipt, drawn = await ledger.run_signed(signed, work)
    ctx.work_arrived.notify()  # the trainer: accepted work
    ctx.validators_waiting.notify(drawn)
    return receipt


AuditId = Annotated[int, Path(ge=1, le=2**31 - 1)]


@router.get("/island-audits", response_model=list[IslandAuditTask])
async def island_audits_open(
    signed: Signed, ledger: LedgerDep, settings: Settings, limit: Annotated[int, Query(ge=1, le=50)] = 4
) -> list[IslandAuditTask]:
    """Pretraining islands' pseudo-gradients drawn for this validator to replay (:mod:`coordinator.services.island_audits`),
    oldest first."""
    return await ledger.run_signed(signed, island_audits.open_audits, limit, settings, ledger.now())


@router.get(
    "/island-audits/{audit_id}/pseudo-gradient",
    responses={200: {"content": {"application/octet-stream": {}}}, 404: {"model": ErrorBody}, 409: {"model": ErrorBody}},
)
async def island_audit_file(audit_id: AuditId, ctx: Ctx, signed: Signed, ledger: LedgerDep) -> Response:
    """The audited pseudo-gradient's bytes, bf16, as the islands received them."""
    key = await ledger.run_signed(signed, island_audits.audited_blob, audit_id)
    return await blob_response(ctx.blobs, key)


@router.post(
    "/island-audits/{audit_id}/verdict",
    response_model=IslandAuditInfo,
    responses={404: {"model": ErrorBody}, 409: {"model": ErrorBody}},
)
async def island_audit_verdict(
    audit_id: AuditId, body: IslandAuditVerdict, signed: Signed, ledger: LedgerDep, settings: Settings
) -> IslandAuditInfo:
    """How far the island's pseudo-gradient is from this validator's replay; judged against the run's tolerance."""
    return await ledger.run_signed(signed, island_audits.vote, audit_id, body, settings, ledger.now())
