"""Wire schemas of validator committees: audit policy, verdict records, appeals, validator standings.

No validator is trusted alone. The coordinator assigns each submission to a validator drawn at
random; a share of accepted work goes to a second, independent validator before the trainer may
read it, every hard rejection gets a second opinion, a disagreement goes to a third, and the
majority stands. Nodes appeal rejections to validators that had not judged the work. A validator
outvoted by the majority earns a strike; enough strikes revoke its role.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

from intellect_protocol.shared.schemas import Address, CheckOutcome, Request
from intellect_protocol.shared.states import AppealStatus, SubmissionStatus

Outcome = Literal["accept", "soft", "hard"]
"""A verdict's class: accepted, rejected (no forgery shown), or rejected as forged or corrupted."""

Purpose = Literal["first", "audit", "second_opinion", "tiebreak", "appeal", "recheck"]


class VerdictRecord(BaseModel):
    """One validator's signed verdict on a submission, as any receipt shows it."""

    validator: str
    purpose: Purpose
    outcome: Outcome
    checks: list[CheckOutcome]
    untrained_rows: list[int] = []
    signature: str
    """Over the verdict text of :mod:`shared.verdicts`."""
    judged_at: datetime
    agreed: bool | None
    """Whether it matched the decision; None when nobody else judged the submission."""
    voided: bool
    """The validator's role was revoked and this verdict no longer counts."""
    agreement_rate: float | None
    """The validator's agreement with the majority over every compared verdict so far."""


class AppealRequest(Request):
    """A node asks validators that had not judged its rejected submission to check it again."""

    address: Address
    submission_id: str = Field(max_length=64)
    reason: str = Field("", max_length=500)


class AppealInfo(BaseModel):
    id: int
    submission_id: str
    address: str
    reason: str
    prior_outcome: Outcome
    status: AppealStatus
    created_at: datetime
    decided_at: datetime | None


class ValidatorStanding(BaseModel):
    """How one validator's verdicts compare with its committees' decisions."""

    address: str
    active: bool
    verdicts: int
    """Verdicts given (voided ones included)."""
    compared: int
    """Verdicts another validator also judged."""
    agreed: int
    agreement_rate: float | None
    strikes: int
    """Times it was outvoted, since it was last granted the role."""
    revoke_reason: str | None
    rows_trained_then_rejected: int = 0
    """Rows of work it approved that the trainer had read before the acceptance was reversed (what
    its lies, if they were lies, cost the model); withheld work the trainer never read is not counted."""


class PublicReceipt(BaseModel):
    """Everything public about one submission: anyone may see who judged it, how, and why."""

    submission_id: str
    task_id: str
    run_id: str
    address: str
    status: SubmissionStatus
    checks: list[CheckOutcome] | None
    """The deciding verdict's checks."""
    reason: str | None
    hard: bool | None
    credit: int
    """Net credit micro-units this submission earned (credit less any clawback; :mod:`shared.money`)."""
    validator: str | None
    """Who gave the deciding verdict."""
    created_at: datetime
    validated_at: datetime | None
    untrained_rows: list[int] = []
    """Rows of accepted work left out of training: a disagreement numerics explain decided a token."""
    sha256: str
    """Of the judged file."""
    verdict_signature: str | None = None
    """The deciding validator's signature (check it with :func:`shared.verdicts.verdict_signer`)."""
    verdicts: list[VerdictRecord] = []
    """Every verdict on this submission, in order, each signed by its validator."""
    appeal: AppealInfo | None = None
    held: bool = False
    """Its validators split and no independent third validator holds the role yet: out of training
    and credit, nobody struck, until one does."""
    trained_rows: int | None = None
    """Rows the trainer had read before its acceptance was reversed (None: never reversed)."""


class AdminReceipt(PublicReceipt):
    """A receipt with what only operators see."""

    blob_key: str
    rows: int
    tokens: int
    prompt_tokens: int
    claimed_by: str | None
    """The validator holding the open review, if one does."""
    claim_expires_at: datetime | None
