"""Wire schemas shared by the coordinator and its clients: the contract at the process boundary.

Every request model forbids unknown fields and bounds every string, list and map, because
whatever a node sends is untrusted.
"""

from __future__ import annotations

import enum
import re
from datetime import UTC, datetime
from typing import Annotated, Literal, get_args

from eth_utils import is_address, to_checksum_address
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from intellect_protocol.shared.prompting import Prompting
from intellect_protocol.shared.states import SubmissionStatus
from intellect_protocol.shared.tolerances import Calibration

VERSION_PATTERN = r"^\d+\.\d+\.\d+([.+-][0-9A-Za-z.+-]{1,32})?$"


def checksum_address(value: str) -> str:
    """``value`` in checksummed form; ValueError when it is not an address."""
    if not re.fullmatch(r"0x[0-9a-fA-F]{40}", value) or not is_address(value):
        raise ValueError("not an Ethereum address (0x followed by 40 hex characters)")
    return to_checksum_address(value)


Address = Annotated[str, AfterValidator(checksum_address)]


def in_utc(value: datetime) -> datetime:
    """An aware time as UTC; one whose UTC equivalent falls outside years 1-9999 is refused (a 422
    at the API) rather than left to overflow later inside the database driver."""
    if value.tzinfo is None:
        return value
    try:
        return value.astimezone(UTC)
    except OverflowError:
        raise ValueError("the time is outside years 1-9999 once converted to UTC") from None


UtcTime = Annotated[datetime, AfterValidator(in_utc)]
"""An Ethereum address, normalised to its checksummed form."""

ShortText = Annotated[str, Field(max_length=256)]


class ErrorCode(enum.StrEnum):
    """Machine-readable error codes; clients branch on these, never on messages."""

    signature_missing = "signature_missing"
    signature_malformed = "signature_malformed"
    signature_invalid = "signature_invalid"
    """The request's own signature does not verify."""
    body_signature_invalid = "body_signature_invalid"
    """A signature inside the body (a verdict's, an operator link's) does not verify."""
    timestamp_out_of_window = "timestamp_out_of_window"
    nonce_reused = "nonce_reused"
    address_mismatch = "address_mismatch"
    rate_limited = "rate_limited"
    request_timeout = "request_timeout"
    body_too_large = "body_too_large"
    validation_error = "validation_error"
    admin_unauthorized = "admin_unauthorized"
    admin_forbidden = "admin_forbidden"
    node_not_registered = "node_not_registered"
    node_banned = "node_banned"
    stake_too_low = "stake_too_low"
    chain_unavailable = "chain_unavailable"
    environment_unavailable = "environment_unavailable"
    """The server lacks the environment plugin version a run pins (an operator must install it)."""
    version_unsupported = "version_unsupported"
    not_found = "not_found"
    no_run = "no_run"
    task_not_leased = "task_not_leased"
    lease_expired = "lease_expired"
    rollout_invalid = "rollout_invalid"
    conflict = "conflict"
    own_work = "own_work"
    role_required = "role_required"
    manifest_invalid = "manifest_invalid"
    manifest_signer_mismatch = "manifest_signer_mismatch"
    """A manifest signed by someone other than the trainer posting it."""
    awaiting_vouches = "awaiting_vouches"
    """A trainer island's step that most live islands have not vouched for (yet): publish it again once they have."""
    plugin_works_here = "plugin_works_here"
    """A node reported a reward failure that the coordinator's own run of the reward does not reproduce."""
    not_submitter = "not_submitter"
    """Only the node that submitted the work may do this (appeal it)."""
    storage_unavailable = "storage_unavailable"
    overloaded = "overloaded"
    http_error = "http_error"


Finite = Annotated[float, Field(allow_inf_nan=False)]
INT32_MAX = 2**31 - 1
"""Largest value an integer column holds on every backend; bigger untrusted numbers get 422, not a 500."""


class Scope(enum.StrEnum):
    """Admin token scopes; each includes the ones before it."""

    read = "read"
    operate = "operate"
    admin = "admin"


class ErrorBody(BaseModel):
    code: ErrorCode
    message: str
    details: dict[str, object] | None = None


class Request(BaseModel):
    model_config = ConfigDict(extra="forbid")


class GpuSpec(Request):
    name: ShortText
    memory_bytes: int = Field(ge=0)


class NodeSpecs(Request):
    """What a node's hardware probe found."""

    cpu_cores: int = Field(ge=0, le=65536)
    ram_bytes: int = Field(ge=0)
    disk_free_bytes: int = Field(ge=0)
    gpus: list[GpuSpec] = Field(default_factory=list, max_length=64)
    platform: ShortText = ""
    python: ShortText = ""
    torch: ShortText | None = None


class RegisterRequest(Request):
    address: Address
    """The signer's own address; a body naming anyone else is refused."""
    operator_address: Address | None = None
    """The wallet of the person or pool running this node, when it differs from the node's."""
    operator_signature: str | None = Field(None, max_length=132)
    """The operator's signature of the link (:func:`shared.links.sign_link`): without it, no
    ``operator_address`` is accepted (a link counts only when the linked address signed it)."""
    specs: NodeSpecs
    client_version: str = Field(pattern=VERSION_PATTERN, max_length=64)


class NodeStatus(enum.StrEnum):
    registered = "registered"
    healthy = "healthy"
    unhealthy = "unhealthy"
    dead = "dead"
    banned = "banned"


class RegisterResponse(BaseModel):
    address: Address
    status: NodeStatus
    first_seen: datetime
    heartbeat_interval_s: float


class HeartbeatRequest(Request):
    address: Address
    client_version: str = Field(pattern=VERSION_PATTERN, max_length=64)
    activity: str = Field("idle", max_length=64)
    """What the node is doing now: idle, downloading, generating, uploading..."""
    metrics: dict[Annotated[str, Field(max_length=64)], float] = Field(default_factory=dict, max_length=64)
    weights: dict[Annotated[str, Field(max_length=64)], Annotated[int, Field(ge=0)]] = Field(default_factory=dict, max_length=16)
    """Per run id, the newest policy step whose verified weights this node holds."""


class HeartbeatResponse(BaseModel):
    action: Literal["continue", "stop"]
    """``stop``: the node must stop working (for now only when banned)."""
    status: NodeStatus
    reason: str | None = None
    heartbeat_interval_s: float
    policy_steps: dict[str, int] = Field(default_factory=dict)
    """Newest published policy step of each active run: nodes fetch it before their tasks need it."""
    server_time: float


class PublicStatus(BaseModel):
    coordinator_version: str
    min_node_version: str
    audience: str
    heartbeat_interval_s: float
    signature_window_s: int
    nodes: dict[NodeStatus, int]
    server_time: float
    max_leases_per_node: int = 3
    """Tasks one node may hold at once: a node keeps this many in flight."""
    protocol_version: int = 1
    """The protocol the coordinator speaks (:data:`shared.version.PROTOCOL_VERSION`); 1: it predates the number."""


class SamplingParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    temperature: float = Field(1.0, ge=0, le=10)
    """Softmax temperature; 0 is greedy."""
    top_p: float = Field(1.0, gt=0, le=1)
    """Nucleus: sample among the most likely tokens holding this much probability."""
    max_tokens: int = Field(128, ge=1, le=1 << 16)
    """Longest completion; a completion this long ends with finish reason ``length``."""
    stop_on_eos: bool = True
    """End a completion at the end-of-sequence token (which is kept as its last token)."""


class WorkWait(BaseModel):
    """Why a node gets no new task now; the lease answers 204 with it in headers
    (``X-Intellect-Wait``: the reason, ``X-Intellect-Wait-Message``, ``Retry-After``)."""

    reason: Literal["no_run", "paused", "no_validator", "validation_capacity", "no_trainer", "trainer_capacity", "held"]
    message: str
    """One sentence for the operator (ASCII: it travels in a header)."""
    retry_after_s: float
    """When asking again may help."""


class LeaseRequest(Request):
    address: Address
    run_id: str | None = Field(None, max_length=64)
    """Ask for work of this run; by default the coordinator picks an active one."""
    working_on: list[Annotated[str, Field(max_length=64)]] = Field(default_factory=list, max_length=8)
    """Tasks this node still holds and is working on: the lease must be another one."""


class TaskSpec(BaseModel):
    """A leased task: what to generate, from which policy, with which seeds, until when."""

    task_id: str
    run_id: str
    environment: str
    environment_version: str
    """The environment plugin every role must run: ``package==version``."""
    model: str
    """Where the run's model lives (a path, or a hub id in real deployments)."""
    prompt_ids: list[str]
    samples_per_prompt: int
    seed: int
    """Task seed; sample i (prompt-major order) uses :func:`sequence_seed` (seed, i)."""
    policy_step: int
    sampling: SamplingParams
    length_alpha: float
    target_length: int
    length_over_only: bool
    prompting: Prompting = Prompting()
    """How each problem is rendered into prompt tokens (the validator checks those tokens)."""
    tolerances: Calibration | None = None
    """The run's calibrated tolerances by numerics (only these numerics are admitted); None: the floors."""
    lease_expires_at: datetime


class SubmissionReceipt(BaseModel):
    submission_id: str
    task_id: str
    sha256: str
    rows: int
    tokens: int
    status: SubmissionStatus
    created_at: datetime


class RoleName(enum.StrEnum):
    validator = "validator"
    trainer = "trainer"
    relay = "relay"


CheckName = Literal["integrity", "assignment", "termination", "toploc", "sampling", "rewards"]
CHECKS: tuple[CheckName, ...] = get_args(CheckName)
"""The validator's checks, in the order it runs them."""
HARD_CHECKS = frozenset({"integrity", "toploc", "sampling"})
"""Failing one of these means forged or corrupted work: a strike, and pending credit clawed back."""


class ClaimRequest(Request):
    address: Address
    limit: int = Field(8, ge=1, le=64)
    wait_s: float = Field(0.0, ge=0, le=10)
    """Hold the request up to this long until work is drawn for the caller (a long poll: a
    validator starts on new work as it arrives instead of sleeping between empty claims)."""


class Claim(BaseModel):
    """A submission leased to one validator until ``claim_expires_at``."""

    submission_id: str
    sha256: str
    task: TaskSpec
    oldest_step: int
    """The oldest policy step the run still accepts."""
    newest_step: int
    claim_expires_at: datetime


class CheckOutcome(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: CheckName
    passed: bool | None
    """None: not run because an earlier check failed."""
    reason: str = Field(max_length=2000)
    explained: bool = False
    """A failure that numerics can explain (an honest node computing in another way could make it):
    no credit for the file, but never a strike, whatever check it is."""


class Judgement(BaseModel):
    """What a list of check outcomes adds up to: the one definition of accepted, hard and explained."""

    checks: list[CheckOutcome]

    @property
    def accepted(self) -> bool:
        return all(c.passed for c in self.checks)

    @property
    def hard(self) -> bool:
        return any(c.passed is False and c.name in HARD_CHECKS and not c.explained for c in self.checks)

    @property
    def explained(self) -> bool:
        """Rejected only by failures that numerics explain."""
        return all(c.passed is not False or c.explained for c in self.checks)

    @property
    def reason(self) -> str:
        failed = [f"{c.name}: {c.reason}" for c in self.checks if c.passed is False]
        return "; ".join(failed) if failed else "all checks passed"


class VerdictRequest(Judgement, Request):
    address: Address
    submission_id: str = Field(max_length=64)
    checks: list[CheckOutcome] = Field(min_length=len(CHECKS), max_length=len(CHECKS))
    untrained_rows: list[Annotated[int, Field(ge=0, le=INT32_MAX)]] = Field(default_factory=list, max_length=4096)
    """Rows of an accepted file the trainer must leave out: a token in them was decided by a
    disagreement that numerics explain, where a node could have chosen (near-tie cherry-picking)."""
    signature: str = Field(pattern=r"^0x[0-9a-fA-F]{130}$")
    """The validator's EIP-191 signature over the verdict (:func:`shared.verdicts.verdict_text`)."""

    @model_validator(mode="after")
    def _every_check_once_in_order(self) -> VerdictRequest:
        if tuple(c.name for c in self.checks) != CHECKS:
            raise ValueError(f"checks must be {', '.join(CHECKS)}, in that order")
        return self


class AcceptedRollouts(BaseModel):
    """One accepted submission for the trainer; ``cursor`` orders them by acceptance."""

    cursor: int
    submission_id: str
    task_id: str
    policy_step: int
    untrained_rows: list[int] = []
    """Rows to leave out of training (see :class:`VerdictRequest`)."""


class TrainerMetricsRequest(Request):
    address: Address
    run_id: str = Field(max_length=64)
    step: int = Field(ge=1, le=INT32_MAX)
    metrics: dict[Annotated[str, Field(max_length=64)], Finite] = Field(max_length=64)
    cursor: int | None = Field(None, ge=0, le=INT32_MAX)
    """The trainer's read position after this step: it learned from the accepted work after the
    previous step's cursor up to this one (where the coordinator's step timing comes from)."""


def sequence_seed(task_seed: int, index: int) -> int:
    """The sampling seed of the ``index``-th sequence of a task (prompt-major order)."""
    return (task_seed * 1_000_003 + index) % (1 << 62)


DEFAULT_MODEL = "tiny-arith"
"""A run's model by default: the tiny model shipped in ``shared/assets/tiny-arith``."""
