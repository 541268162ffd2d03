"""Ledger tables of trainer islands (:mod:`shared.island_schemas` says how a share moves). Imported by
``migrations/env.py`` so the tables share the ledger's metadata."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Boolean, Float, ForeignKey, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from intellect_protocol.coordinator.column_types import states_type
from intellect_protocol.coordinator.models import Base
from intellect_protocol.shared.states import AuditState, ShareState


class Island(Base):
    """A trainer island of a run: its name is bound to the trainer address that first used it."""

    __tablename__ = "islands"

    run_id: Mapped[str] = mapped_column(String(64), ForeignKey("runs.id"), primary_key=True)
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    address: Mapped[str] = mapped_column(String(42))
    joined_at: Mapped[datetime]
    last_seen: Mapped[datetime]
    outer_step: Mapped[int] = mapped_column(Integer, default=-1)
    """The last outer step it reported a share for."""
    excluded_steps: Mapped[int] = mapped_column(Integer, default=0)
    last_exclusion: Mapped[str | None] = mapped_column(Text)


class IslandShare(Base):
    """One accepted submission (by its cursor) as held by one island; a cursor with no row is unclaimed."""

    __tablename__ = "island_shares"
    __table_args__ = (Index("ix_island_shares_run_island_state", "run_id", "island", "state"),)

    run_id: Mapped[str] = mapped_column(String(64), ForeignKey("runs.id"), primary_key=True)
    cursor: Mapped[int] = mapped_column(Integer, primary_key=True)
    island: Mapped[str] = mapped_column(String(64))
    state: Mapped[ShareState] = mapped_column(states_type(ShareState))
    claimed_at: Mapped[datetime]
    outer_step: Mapped[int | None] = mapped_column(Integer)
    attempt: Mapped[str | None] = mapped_column(String(32))
    """The outer step and attempt whose pseudo-gradient learned from it (set when reported)."""
    position: Mapped[int | None] = mapped_column(Integer)
    """Its place in that report: the order the island learnt its claims in, which a pretraining audit replays."""
    start_digest: Mapped[str | None] = mapped_column(String(64))
    """That report's: the sha256 of the island's pseudo-gradient of the step before that its round (overlapped)
    subtracted from the agreed weights to start from."""


class StepVouch(Base):
    """One island's word on a policy step of its run: the content it built from the agreed weights, the island
    the meeting chose to publish it, and the step's record. A step is published, and settled, only as most live
    islands vouch."""

    __tablename__ = "step_vouches"

    run_id: Mapped[str] = mapped_column(String(64), ForeignKey("runs.id"), primary_key=True)
    step: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    island: Mapped[str] = mapped_column(String(64), primary_key=True)
    address: Mapped[str] = mapped_column(String(42))
    content: Mapped[str] = mapped_column(String(64))
    publisher: Mapped[str] = mapped_column(String(64))
    record: Mapped[str] = mapped_column(String(64))
    """The step's record (:func:`shared.island_schemas.step_record`): what settles it."""
    created_at: Mapped[datetime]


class IslandAudit(Base):
    """The draw, and then the audit, of one island's pseudo-gradient in a published step of a pretraining run
    (:mod:`coordinator.services.island_audits`)."""

    __tablename__ = "island_audits"
    __table_args__ = (UniqueConstraint("run_id", "outer_step", "island"), Index("ix_island_audits_state", "state"))

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(String(64), ForeignKey("runs.id"))
    outer_step: Mapped[int] = mapped_column(Integer)
    island: Mapped[str] = mapped_column(String(64))
    address: Mapped[str] = mapped_column(String(42))
    """The trainer address the island belonged to when the step was settled."""
    attempt: Mapped[str] = mapped_column(String(32))
    digest: Mapped[str] = mapped_column(String(64))
    """sha256 of the pseudo-gradient as the islands received it, from the step's record."""
    state: Mapped[AuditState] = mapped_column(states_type(AuditState))
    blob_key: Mapped[str | None] = mapped_column(String(200))
    drawn_at: Mapped[datetime]
    decided_at: Mapped[datetime | None]
    outcome: Mapped[str | None] = mapped_column(Text)
    """Why it was decided as it was (shown with the island's status and cited when its stake is slashed)."""
    start_audit_id: Mapped[int | None] = mapped_column(Integer, ForeignKey("island_audits.id"))
    """Overlapped rounds: the audit of the island's pseudo-gradient its round subtracted from the agreed weights to
    start from (its bytes are needed to replay this one)."""
    assignee: Mapped[str | None] = mapped_column(String(42))
    """The validator drawn to replay it next: only it may fetch its bytes and judge it
    (:func:`coordinator.services.island_audits.open_audits`)."""
    assigned_at: Mapped[datetime | None]


class IslandAuditVote(Base):
    """One validator's replay of an audited pseudo-gradient: how far what the island sent is from it."""

    __tablename__ = "island_audit_votes"

    audit_id: Mapped[int] = mapped_column(Integer, ForeignKey("island_audits.id"), primary_key=True)
    validator: Mapped[str] = mapped_column(String(42), primary_key=True)
    relative_error: Mapped[float] = mapped_column(Float)
    cosine: Mapped[float] = mapped_column(Float)
    passed: Mapped[bool] = mapped_column(Boolean)
    """Judged by the coordinator from ``relative_error`` and the run's tolerance, never by the validator's word."""
    at: Mapped[datetime]
