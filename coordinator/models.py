"""The ledger's tables, as SQLAlchemy 2 typed ORM models.

Schema changes go through Alembic (``migrations/``), never ``create_all``. History is
append-only: a node's status lives on its row for fast reads, and every change of it is
also a new :class:`NodeStatusEvent` row.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    case,
)
from sqlalchemy.ext.hybrid import hybrid_property
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.sql.elements import ColumnElement

from intellect_protocol.coordinator.column_types import TokenAmount, UTCDateTime, states_type
from intellect_protocol.shared.run_schemas import oldest_usable_step
from intellect_protocol.shared.schemas import NodeStatus
from intellect_protocol.shared.states import AppealStatus, EntryKind, RunKind, RunStatus, SubmissionStatus, TaskStatus


class Base(DeclarativeBase):
    type_annotation_map = {datetime: UTCDateTime, dict[str, Any]: JSON}


class Deployment(Base):
    """Key/value facts about this deployment, such as the audience id signatures are bound to."""

    __tablename__ = "deployment"

    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(Text)


class Node(Base):
    __tablename__ = "nodes"

    address: Mapped[str] = mapped_column(String(42), primary_key=True)
    operator_address: Mapped[str | None] = mapped_column(String(42))
    """Who runs this node; set only with that operator's signature (:mod:`shared.links`), so no node
    can claim a link to a validator in order to keep it out of its committee."""
    operator_signature: Mapped[str | None] = mapped_column(String(132))
    specs: Mapped[dict[str, Any]]
    client_version: Mapped[str] = mapped_column(String(64))
    status: Mapped[NodeStatus] = mapped_column(states_type(NodeStatus), index=True)
    ban_reason: Mapped[str | None] = mapped_column(Text)
    first_seen: Mapped[datetime]
    last_seen: Mapped[datetime]
    last_heartbeat_at: Mapped[datetime | None]
    last_heartbeat: Mapped[dict[str, Any] | None]
    status_changed_at: Mapped[datetime]
    strikes: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    """Hard rejections so far; enough of them ban the node."""


class NodeStatusEvent(Base):
    """One status transition of one node; rows are only ever added."""

    __tablename__ = "node_status_events"
    __table_args__ = (Index("ix_node_status_events_address_id", "address", "id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    address: Mapped[str] = mapped_column(String(42), ForeignKey("nodes.address"))
    from_status: Mapped[NodeStatus | None] = mapped_column(states_type(NodeStatus))
    to_status: Mapped[NodeStatus] = mapped_column(states_type(NodeStatus))
    reason: Mapped[str] = mapped_column(Text)
    at: Mapped[datetime]


class Nonce(Base):
    """A request nonce already used by an address; the unique key is the replay guard."""

    __tablename__ = "nonces"
    __table_args__ = (UniqueConstraint("address", "nonce", name="uq_nonces_address_nonce"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    address: Mapped[str] = mapped_column(String(42))
    nonce: Mapped[str] = mapped_column(String(64))
    seen_at: Mapped[datetime] = mapped_column(index=True)


class AdminToken(Base):
    """An operator's bearer token; only the sha256 of its secret part is stored."""

    __tablename__ = "admin_tokens"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(128))
    secret_sha256: Mapped[str] = mapped_column(String(64))
    scopes: Mapped[str] = mapped_column(String(128))
    created_at: Mapped[datetime]
    revoked_at: Mapped[datetime | None]


class Run(Base):
    """A run: which model learns which environment and how nodes sample for it (RL), or which corpus (pretraining)."""

    __tablename__ = "runs"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    environment: Mapped[str] = mapped_column(String(64))
    environment_version: Mapped[str] = mapped_column(String(256))
    """The environment plugin's ``package==version`` when the run was created: every role must run exactly it."""
    model: Mapped[str] = mapped_column(Text)
    sampling: Mapped[dict[str, Any]]
    prompts_per_task: Mapped[int] = mapped_column(Integer)
    samples_per_prompt: Mapped[int] = mapped_column(Integer)
    length_budget: Mapped[dict[str, Any]]
    prompting: Mapped[dict[str, Any] | None]
    """The run's :class:`shared.schemas.Prompting`; None: no system prompt, the template's default thinking."""
    tolerances: Mapped[dict[str, Any] | None]
    """Calibrated :class:`shared.tolerances.Tolerance` by numerics name; None: uncalibrated."""
    tolerances_set_at: Mapped[datetime | None]
    """When :attr:`tolerances` were last set (None: never, the floors)."""
    policy_step: Mapped[int] = mapped_column(Integer)
    next_prompt: Mapped[int] = mapped_column(Integer)
    """Cursor into the environment's problems: the coordinator, not nodes, picks prompts."""
    status: Mapped[RunStatus] = mapped_column(states_type(RunStatus))
    created_at: Mapped[datetime]
    async_level: Mapped[int] = mapped_column(Integer, default=2, server_default="2")
    """Rollouts of a policy older than ``policy_step - async_level`` are refused."""
    dispute_window_s: Mapped[float | None] = mapped_column(Float)
    """How long this run's credit stays pending; None: the coordinator's default."""
    audit: Mapped[dict[str, Any] | None]
    """The run's :class:`shared.committee.AuditPolicy`; None: its defaults."""
    min_stake: Mapped[int] = mapped_column(TokenAmount, default=0, server_default="0")
    """Token base units a node must have staked to lease this run's tasks (0: none)."""
    outer: Mapped[dict[str, Any] | None]
    """The run's :class:`shared.island_schemas.OuterSettings` for trainer islands; None: its defaults."""
    trainer_cursor: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    """The trainer's last read position (a credit entry id): accepted work after it is unread."""
    plugin_failures: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    """Reward calls of the run's environment that failed on a node and again here, since it last ran."""
    paused_reason: Mapped[str | None] = mapped_column(Text)
    """Why the coordinator paused the run by itself (None: it did not)."""
    kind: Mapped[RunKind] = mapped_column(states_type(RunKind), default=RunKind.rl, server_default="rl")
    """``rl``, or ``pretrain``: islands learn from :attr:`corpus`'s shards, nodes have no tasks."""
    corpus: Mapped[dict[str, Any] | None]
    """A pretraining run's :class:`shared.pretraining.manifest.CorpusManifest`; its shards are in the blob store."""
    pretrain: Mapped[dict[str, Any] | None]
    """A pretraining run's :class:`shared.pretraining.settings.PretrainSettings`."""

    @hybrid_property
    def oldest_step(self) -> int:
        """The oldest policy step this run still trains on (:func:`~shared.run_schemas.oldest_usable_step`)."""
        return oldest_usable_step(self.policy_step, self.async_level)

    @oldest_step.inplace.expression
    @classmethod
    def _oldest_step_expression(cls) -> ColumnElement[int]:
        # The same rule in SQL, for queries that select by it.
        return case((cls.policy_step > cls.async_level, cls.policy_step - cls.async_level), else_=0)


class PluginFailureReporter(Base):
    """A node whose report of the run's reward failing was reproduced here, since the run last ran."""

    __tablename__ = "plugin_failure_reporters"
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id"), primary_key=True)
    address: Mapped[str] = mapped_column(String(42), primary_key=True)
    failures: Mapped[int] = mapped_column(Integer)


class Task(Base):
    __tablename__ = "tasks"
    __table_args__ = (Index("ix_tasks_run_status", "run_id", "status"),)

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    run_id: Mapped[str] = mapped_column(String(64), ForeignKey("runs.id"))
    prompt_ids: Mapped[dict[str, Any]]
    """``{"ids": [...]}``: the problems this task covers."""
    seed: Mapped[int] = mapped_column(BigInteger)
    policy_step: Mapped[int] = mapped_column(Integer)
    status: Mapped[TaskStatus] = mapped_column(states_type(TaskStatus))
    leased_to: Mapped[str | None] = mapped_column(String(42))
    lease_expires_at: Mapped[datetime | None]
    created_at: Mapped[datetime]
    leased_at: Mapped[datetime | None]
    """When its current (last) lease began: where the time a node spends on it starts."""
    params: Mapped[dict[str, Any] | None]
    """The run's sampling settings when the task was made, so a later run update never changes
    what an outstanding task is checked against (None: tasks older than this column)."""


class Submission(Base):
    """An uploaded rollout file awaiting validation; one per task."""

    __tablename__ = "submissions"
    __table_args__ = (
        Index("ix_submissions_run_created", "run_id", "created_at"),
        Index("ix_submissions_run_validated", "run_id", "validated_at"),
    )

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    task_id: Mapped[str] = mapped_column(String(64), ForeignKey("tasks.id"), unique=True)
    run_id: Mapped[str] = mapped_column(String(64), ForeignKey("runs.id"))
    address: Mapped[str] = mapped_column(String(42), index=True)
    sha256: Mapped[str] = mapped_column(String(64))
    blob_key: Mapped[str] = mapped_column(Text)
    rows: Mapped[int] = mapped_column(Integer)
    tokens: Mapped[int] = mapped_column(Integer)
    status: Mapped[SubmissionStatus] = mapped_column(states_type(SubmissionStatus), index=True)
    """pending (awaiting its validators' verdicts), accepted, rejected, expired (stale before it was
    checked: no penalty), or invalidated (by an admin, after acceptance)."""
    created_at: Mapped[datetime]
    upload_started_at: Mapped[datetime | None]
    """When its upload's first byte arrived (``created_at``: when it was stored and recorded)."""
    prompt_tokens: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    outcome: Mapped[str | None] = mapped_column(String(8))
    """What its validators last decided (accept, soft or hard; None before any decision): kept while
    a decision is reopened, so the new one changes only what differs."""
    validator: Mapped[str | None] = mapped_column(String(42))
    checks: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON)
    reason: Mapped[str | None] = mapped_column(Text)
    hard: Mapped[bool | None]
    validated_at: Mapped[datetime | None]
    untrained_rows: Mapped[list[int] | None] = mapped_column(JSON)
    """Rows of accepted work the trainer leaves out: a disagreement numerics explain decided a token."""
    verdict_signature: Mapped[str | None] = mapped_column(String(132))
    """The deciding validator's signature over its verdict (:mod:`shared.verdicts`)."""
    held_at: Mapped[datetime | None]
    """Since when its validators' split waits for an independent third one (none holds the role):
    out of training and credit, and out of the run's validation backlog, until one does."""
    trained_rows: Mapped[int | None] = mapped_column(Integer)
    """Rows the trainer had already read when its acceptance was reversed (None: never happened)."""
    groups: Mapped[int | None] = mapped_column(Integer)
    flat_groups: Mapped[int | None] = mapped_column(Integer)
    task_reward_sum: Mapped[float | None] = mapped_column(Float)
    """Its groups (a prompt's samples), those whose task rewards do not vary (GRPO learns nothing from them),
    and the sum of its rows' task rewards, from the file as recorded (None: recorded before these were kept)."""


class Review(Base):
    """One validator's assignment to judge one submission, and its verdict once given.

    The coordinator opens a review when a submission needs another verdict (first look, audit,
    second opinion, tie-break, appeal, re-check) and assigns it to a validator drawn at random;
    an assignment not answered by ``expires_at`` is drawn again. A verdict of a validator later
    revoked is *voided*, never deleted."""

    __tablename__ = "reviews"
    __table_args__ = (Index("ix_reviews_open", "outcome", "validator"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    submission_id: Mapped[str] = mapped_column(String(64), ForeignKey("submissions.id"), index=True)
    purpose: Mapped[str] = mapped_column(String(16))
    """first, audit, second_opinion, tiebreak, appeal or recheck."""
    appeal_id: Mapped[int | None] = mapped_column(Integer, ForeignKey("appeals.id"))
    opened_at: Mapped[datetime]
    validator: Mapped[str | None] = mapped_column(String(42), index=True)
    expires_at: Mapped[datetime | None]
    claimed_at: Mapped[datetime | None]
    """When the assigned validator fetched the assignment."""
    outcome: Mapped[str | None] = mapped_column(String(8))
    """accept, soft or hard; None until the verdict."""
    checks: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON)
    untrained_rows: Mapped[list[int] | None] = mapped_column(JSON)
    signature: Mapped[str | None] = mapped_column(String(132))
    judged_at: Mapped[datetime | None]
    agreed: Mapped[bool | None]
    """Whether the verdict matched its committee's decision; None when nobody else judged."""
    voided_at: Mapped[datetime | None]
    void_reason: Mapped[str | None] = mapped_column(Text)
    retry_at: Mapped[datetime | None] = mapped_column(index=True)
    """No validator could be drawn for it when last tried: not drawn for again before this time,
    so reviews nobody can judge never crowd out those somebody can."""


class Appeal(Base):
    """A node's appeal of a rejection, heard by validators that had not judged the work."""

    __tablename__ = "appeals"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    submission_id: Mapped[str] = mapped_column(String(64), ForeignKey("submissions.id"), unique=True)
    address: Mapped[str] = mapped_column(String(42), index=True)
    reason: Mapped[str] = mapped_column(Text)
    prior_outcome: Mapped[str] = mapped_column(String(8))
    status: Mapped[AppealStatus] = mapped_column(states_type(AppealStatus))
    created_at: Mapped[datetime] = mapped_column(index=True)
    decided_at: Mapped[datetime | None]


class NodeStrike(Base):
    """One strike given to (+1) or taken back from (-1) a node; ``Node.strikes`` is their sum."""

    __tablename__ = "node_strikes"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    address: Mapped[str] = mapped_column(String(42), index=True)
    submission_id: Mapped[str | None] = mapped_column(String(64), index=True)
    units: Mapped[int] = mapped_column(Integer)
    reason: Mapped[str] = mapped_column(Text)
    at: Mapped[datetime]


class ValidatorStrike(Base):
    """A validator outvoted by the majority on one submission, or on one island audit; enough of them revoke its role."""

    __tablename__ = "validator_strikes"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    validator: Mapped[str] = mapped_column(String(42), index=True)
    submission_id: Mapped[str | None] = mapped_column(String(64), ForeignKey("submissions.id"))
    island_audit_id: Mapped[int | None] = mapped_column(Integer)
    """Set instead of ``submission_id`` for an island audit's verdict (:mod:`coordinator.services.island_audits`)."""
    reason: Mapped[str] = mapped_column(Text)
    at: Mapped[datetime]


class Role(Base):
    """A role an admin granted an address: ``validator``, ``trainer`` or ``relay``.

    Revoking sets ``revoked_at``; granting again adds a new row, so the history stays.
    """

    __tablename__ = "roles"
    __table_args__ = (Index("ix_roles_address_role", "address", "role"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    address: Mapped[str] = mapped_column(String(42))
    role: Mapped[str] = mapped_column(String(16))
    granted_by: Mapped[str] = mapped_column(String(128))
    granted_at: Mapped[datetime]
    revoked_at: Mapped[datetime | None]
    revoke_reason: Mapped[str | None] = mapped_column(Text)
    last_seen: Mapped[datetime | None]
    """A validator's last claim: only validators seen within ``validator_live_s`` are assigned work."""


class ContributionEntry(Base):
    """One append-only ledger entry: credit for an accepted submission, or a negative clawback.

    An entry is pending until ``final_at`` (the end of the dispute window), final after; a
    balance is the sum of entries, and no entry is ever changed or deleted.
    """

    __tablename__ = "contributions"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    address: Mapped[str] = mapped_column(String(42), index=True)
    submission_id: Mapped[str] = mapped_column(String(64), ForeignKey("submissions.id"), index=True)
    kind: Mapped[EntryKind] = mapped_column(states_type(EntryKind))
    units: Mapped[int] = mapped_column(BigInteger)
    """Credit micro-units (:mod:`shared.money`): positive for credit and restores, negative for clawbacks."""
    reason: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(index=True)
    final_at: Mapped[datetime]
    cause_id: Mapped[str | None] = mapped_column(String(64), index=True)
    """For a clawback, the submission whose rejection caused it (a restore undoes it if that rejection is overturned)."""


class TrainerMetrics(Base):
    """One policy step's training summary, as the trainer posted it (for the leaderboard's charts)."""

    __tablename__ = "trainer_metrics"
    __table_args__ = (UniqueConstraint("run_id", "step"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(String(64), ForeignKey("runs.id"))
    step: Mapped[int] = mapped_column(Integer)
    metrics: Mapped[dict[str, Any]]
    created_at: Mapped[datetime]
    cursor: Mapped[int | None] = mapped_column(Integer)
    """The trainer's read position after this step (a credit entry id)."""


class Evaluation(Base):
    """An operator's evaluation of one policy step (e.g. held-out accuracy), shown beside the trainer's metrics."""

    __tablename__ = "evaluations"
    __table_args__ = (UniqueConstraint("run_id", "step"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(String(64), ForeignKey("runs.id"))
    step: Mapped[int] = mapped_column(Integer)
    metrics: Mapped[dict[str, Any]]
    created_at: Mapped[datetime]
