"""Wire schemas of runs (RL and pretraining): what anyone may know of a run, what operators set, and its progress."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, computed_field, model_validator

from intellect_protocol.shared.environments.length import LengthBudget
from intellect_protocol.shared.island_schemas import OuterSettings
from intellect_protocol.shared.money import TokenAmount
from intellect_protocol.shared.pretraining.manifest import CorpusManifest
from intellect_protocol.shared.pretraining.settings import PretrainSettings
from intellect_protocol.shared.prompting import Prompting
from intellect_protocol.shared.schemas import DEFAULT_MODEL, INT32_MAX, Finite, SamplingParams
from intellect_protocol.shared.states import RunKind, RunStatus
from intellect_protocol.shared.tolerances import Calibration, Tolerance, widening

RunName = Annotated[str, Field(min_length=1, max_length=128)]
PromptsPerTask = Annotated[int, Field(ge=1, le=1024)]
SamplesPerPrompt = Annotated[int, Field(ge=1, le=256)]
AsyncLevel = Annotated[int, Field(ge=0, le=64)]
DisputeWindow = Annotated[float, Field(ge=0, le=10 * 365 * 86400)]


def oldest_usable_step(policy_step: int, async_level: int) -> int:
    """The staleness rule: at policy step ``policy_step``, rollouts of policies older than the returned
    step are of no use to the trainer (they lag by more than ``async_level`` steps; 0: on-policy only).

    The coordinator refuses, expires and leases by it and the trainer reads by it; ``Run.oldest_step``
    is the same rule as a SQL expression."""
    return max(0, policy_step - async_level)


class AuditPolicy(BaseModel):
    """How much accepted work a second validator checks before the trainer may read it (a run setting).

    A submission's audit chance is the highest share that applies to it."""

    model_config = ConfigDict(extra="forbid")

    share: float = Field(0.1, ge=0, le=1)
    """Share of accepted submissions audited."""
    new_node_share: float = Field(0.5, ge=0, le=1)
    """Share for nodes with fewer than ``new_node_accepted`` accepted submissions."""
    new_node_accepted: int = Field(20, ge=0, le=1_000_000)
    """Accepted submissions after which a node is no longer new."""
    suspect_share: float = Field(1.0, ge=0, le=1)
    """Share for acceptances by a validator under suspicion: one with a strike, or one with fewer
    than ``new_validator_verdicts`` verdicts (nobody vouches for a new validator yet)."""
    new_validator_verdicts: int = Field(20, ge=0, le=1_000_000)
    """Verdicts after which a validator is no longer new."""


class RunInfo(BaseModel):
    """What anyone may know about a run."""

    id: str
    name: str
    environment: str
    environment_version: str
    """The environment plugin every role must have installed to work on this run: ``package==version``."""
    model: str
    sampling: SamplingParams
    prompts_per_task: int
    samples_per_prompt: int
    policy_step: int
    async_level: int
    """Rollouts of a policy older than ``policy_step - async_level`` are refused (INTELLECT-2: 2)."""
    length_budget: dict[str, Any]
    prompting: Prompting | None = None
    """System prompt and thinking switch for the chat template; None: neither."""
    tolerances: dict[str, Tolerance] | None = None
    """How far honest work may be from a validator's recomputation, by the numerics the run admits, as
    calibrated on the run's model; None: uncalibrated (the shipped model's bounds, any numerics)."""

    tolerances_set_at: datetime | None = None
    """When :attr:`tolerances` were last set (None: never)."""

    @computed_field  # type: ignore[prop-decorator]
    @property
    def tolerances_widened_by(self) -> float:
        """How far the widest of :attr:`tolerances` exceeds the shipped model's bounds, as a factor (1.0: none);
        past :data:`shared.tolerances.OPERATOR_CEILING` only an admin-scope token could set it."""
        return round(widening(self.tolerances), 2)

    dispute_window_s: float | None
    """None: the coordinator's default."""
    min_stake: TokenAmount = 0
    """Token base units a node must have staked to lease this run's tasks (0: none)."""
    audit: AuditPolicy | None = None
    """None: :class:`AuditPolicy`'s defaults."""
    outer: OuterSettings | None = None
    """How trainer islands meet for outer steps; None: :class:`OuterSettings`' defaults."""
    kind: RunKind = RunKind.rl
    corpus: CorpusManifest | None = None
    """A pretraining run's corpus: its shards by hash (fetched from the coordinator by its islands)."""
    pretrain: PretrainSettings | None = None
    """How a pretraining run's islands take their inner steps."""
    status: RunStatus
    """A paused run leases no new tasks."""
    paused_reason: str | None = None
    """Why the coordinator paused the run by itself (None: it did not; an operator's pause says nothing here)."""
    plugin_failures: int = 0
    """Reward calls of the run's environment that failed on a node and again on the coordinator, since it last ran."""
    created_at: datetime


BUDGET_FIELDS = {"length_alpha", "target_length", "length_over_only"}
""":class:`RunSettings`' fields that are a run's one :class:`LengthBudget`."""


class RunSettings(BaseModel):
    """A run's settings an operator may change while it runs; tasks made before a change keep the old ones."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = Field(None, min_length=1, max_length=512)
    """Model path or hub id the policy starts from."""
    sampling: SamplingParams | None = None
    """How nodes sample: temperature, top_p, max_tokens."""
    prompts_per_task: PromptsPerTask | None = None
    """Prompts in one task."""
    samples_per_prompt: SamplesPerPrompt | None = None
    """Samples per prompt: the GRPO group size."""
    length_alpha: float | None = Field(None, ge=0, le=1e3)
    """Thinking-budget penalty per token off target; 0 disables it."""
    target_length: int | None = Field(None, ge=1, le=1 << 20)
    """Thinking-budget target length, in tokens."""
    length_over_only: bool | None = None
    """Penalise only tokens past the target (a ceiling), not short answers too (a target)."""
    prompting: Prompting | None = None
    """A system prompt and the chat template's thinking switch (replaces both)."""
    tolerances: Calibration | None = None
    """Tolerances calibrated on the run's model by numerics (``intellect-validator calibrate``); only these
    numerics are admitted, and no bound is below the shipped model's (replaces the calibration)."""
    async_level: AsyncLevel | None = None
    """Accept rollouts of policies at most this many steps old (0: synchronous)."""
    dispute_window_s: DisputeWindow | None = None
    """How long credit stays pending (clawback possible) before it is final."""
    audit: AuditPolicy | None = None
    """How much work a second validator checks before the trainer may read it."""
    outer: OuterSettings | None = None
    """How trainer islands meet: inner steps between outer steps, the outer learning rate and momentum."""
    min_stake: TokenAmount | None = None
    """Token base units (a decimal string) a node must have staked in the deployment's stake registry to lease this run's tasks
    (0: none). Needs settlement on a chain (``INTELLECT_CHAIN_RPC_URL``)."""


class RunCreate(RunSettings):
    """A new run; unset settings take the defaults of ``intellect-coordinator run create``."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "name": "arith-1",
                    "environment": "arithmetic",
                    "samples_per_prompt": 8,
                    "sampling": {"temperature": 1.0, "max_tokens": 64},
                    "async_level": 2,
                }
            ]
        },
    )

    name: RunName
    """Unique name."""
    environment: str = Field("arithmetic", max_length=64)
    """An environment plugin installed on the coordinator (built in: arithmetic, math, code); the run pins its version."""


class RunSpec(BaseModel):
    """Every setting of a new run, and the one place the network's defaults for them are written:
    the admin API (:meth:`of` a :class:`RunCreate`) and ``intellect-coordinator run create`` both build one."""

    model_config = ConfigDict(extra="forbid")

    name: RunName
    """Unique name."""
    environment: str = Field("arithmetic", max_length=64)
    """An environment plugin installed on the coordinator (built in: arithmetic, math, code); the run pins its version."""
    model: str = Field(DEFAULT_MODEL, min_length=1, max_length=512)
    """Model path or hub id the policy starts from."""
    sampling: SamplingParams = SamplingParams(max_tokens=48)
    """How nodes sample."""
    prompts_per_task: PromptsPerTask = 4
    """Prompts in one task."""
    samples_per_prompt: SamplesPerPrompt = 4
    """Samples per prompt: the GRPO group size."""
    length_budget: LengthBudget = LengthBudget()
    """The thinking budget (off by default)."""
    prompting: Prompting = Prompting()
    """No system prompt, the chat template's default thinking."""
    tolerances: Calibration | None = None
    """Uncalibrated: the shipped model's bounds, any numerics."""
    async_level: AsyncLevel = 2
    """Accept rollouts of policies at most this many steps old (INTELLECT-2: 2)."""
    dispute_window_s: DisputeWindow | None = None
    """How long credit stays pending; None: the coordinator's default."""
    audit: AuditPolicy | None = None
    """None: :class:`AuditPolicy`'s defaults."""
    outer: OuterSettings | None = None
    """None: :class:`OuterSettings`' defaults."""
    min_stake: TokenAmount = 0
    """Token base units a node must have staked to lease this run's tasks (0: none)."""
    kind: RunKind = RunKind.rl
    """``pretrain``: islands learn from ``corpus`` with ``pretrain``'s inner steps, and the RL settings are unused."""
    corpus: CorpusManifest | None = None
    """A pretraining run's corpus (required for one, refused for an RL run)."""
    pretrain: PretrainSettings | None = None
    """A pretraining run's inner steps; None: :class:`PretrainSettings`' defaults."""

    @model_validator(mode="after")
    def _corpus_for_pretraining(self) -> RunSpec:
        if (self.kind == RunKind.pretrain) != (self.corpus is not None):
            raise ValueError("a pretraining run needs a corpus, and only a pretraining run has one")
        if self.kind == RunKind.rl and self.pretrain is not None:
            raise ValueError("pretraining settings are for a pretraining run")
        if self.kind == RunKind.rl and self.outer is not None and self.outer.overlap:
            # An RL island waiting for accepted work while a meeting is in flight could wait on nodes waiting for that step.
            raise ValueError("overlapped outer steps are for pretraining runs")
        return self

    @classmethod
    def of(cls, create: RunCreate) -> RunSpec:
        """``create``'s settings, the defaults where it left one out."""
        given = create.model_dump(exclude_none=True, exclude=BUDGET_FIELDS)
        budget = {"alpha": create.length_alpha, "target_tokens": create.target_length, "over_only": create.length_over_only}
        return cls(**given, length_budget=LengthBudget(**{k: v for k, v in budget.items() if v is not None}))


RUN_DEFAULTS = RunSpec(name="defaults")
"""A run created with nothing but a name (the CLI's option defaults read it)."""


class LearningSignal(BaseModel):
    """What GRPO can learn from the work accepted since the run's current policy step (:mod:`coordinator.services.learning_signal`)."""

    groups: int
    """Groups (a prompt's samples) accepted."""
    flat_groups: int
    """Of those, groups whose task rewards do not vary: GRPO learns nothing from them."""
    task_reward_mean: float | None
    stalled: str | None
    """One sentence, with the figures and what to do, once enough groups came in for long enough and none had a spread."""


class RunProgress(BaseModel):
    submissions: dict[str, int]
    """Counts by status (pending, accepted, rejected, invalidated) and ``accepted_tokens``."""
    steps: list[dict[str, float]]
    """Per policy step, the trainer's metrics (``step``, loss, reward, task_reward, length, ...)."""
    evaluations: list[dict[str, float]] = []
    """Per policy step, operators' evaluations (``step``, e.g. ``heldout_accuracy``)."""
    learning: LearningSignal | None = None
    """The learning signal of the work accepted since the current policy step."""


class EvaluationRequest(BaseModel):
    """An operator's evaluation of one policy step, e.g. held-out accuracy measured off the network."""

    model_config = ConfigDict(
        extra="forbid", json_schema_extra={"examples": [{"step": 3, "metrics": {"heldout_accuracy": 0.71}}]}
    )

    step: int = Field(ge=0, le=INT32_MAX)
    metrics: dict[Annotated[str, Field(max_length=64)], Finite] = Field(max_length=64)


class StepTiming(BaseModel):
    """Where one policy step's wall clock went, from the coordinator's own timestamps.

    The step is made from the accepted work the trainer read for it (its cursor range). Phase
    times of that work are means over its submissions; the two trainer phases split the
    interval since the previous step, so ``trainer_wait_s + training_s == interval_s``.
    """

    step: int
    interval_s: float
    """From the previous step's registration (the run's first lease for step 1) to this one's."""
    node_s: float | None
    """Lease to first upload byte: the node's queue, any weight download, generation and proofs."""
    upload_s: float | None
    """First upload byte to stored and recorded."""
    validation_s: float | None
    """Recorded to accepted (claims, checks and audits): when the trainer may read it."""
    trainer_wait_s: float
    """The trainer waiting for the last submission it needed to be accepted."""
    training_s: float
    """The trainer's update and publication after its batch was complete."""
    submissions: int
    """Accepted submissions the step read."""
    expired: int
    """Submissions the network let go stale during the interval (no validator looked at them)."""
    expired_tokens: int
    dropped_stale: float | None = None
    """Groups the trainer dropped as too old for its window (its own count)."""
