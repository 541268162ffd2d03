"""Ledger tables of on-chain settlement: each epoch's credit tree and, once confirmed, its anchor.

Rows are only ever added: an epoch and its leaves are fixed when the epoch closes, and an anchor
row appears once the root's transaction is confirmed. Imported by ``migrations/env.py`` so the
tables share the ledger's metadata.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import JSON, ForeignKey, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from intellect_protocol.coordinator.models import Base


class Epoch(Base):
    """The Merkle root of every address's cumulative final credit: entries up to ``last_entry_id``
    that were final at ``cutoff``."""

    __tablename__ = "epochs"

    epoch: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    root: Mapped[str] = mapped_column(String(66))
    last_entry_id: Mapped[int] = mapped_column(Integer)
    cutoff: Mapped[datetime]
    addresses: Mapped[int] = mapped_column(Integer)
    total: Mapped[str] = mapped_column(String(80))
    """Sum of the cumulative amounts (token base units, decimal: beyond any SQL integer)."""
    created_at: Mapped[datetime]


class EpochLeaf(Base):
    __tablename__ = "epoch_leaves"

    epoch: Mapped[int] = mapped_column(Integer, ForeignKey("epochs.epoch"), primary_key=True)
    address: Mapped[str] = mapped_column(String(42), primary_key=True)
    cumulative: Mapped[str] = mapped_column(String(80))
    """Token base units, decimal."""


class EpochAnchor(Base):
    """An epoch's root, confirmed on chain."""

    __tablename__ = "epoch_anchors"

    epoch: Mapped[int] = mapped_column(Integer, ForeignKey("epochs.epoch"), primary_key=True)
    tx_hash: Mapped[str] = mapped_column(String(66))
    block: Mapped[int] = mapped_column(Integer)
    anchored_at: Mapped[datetime]


class Slashing(Base):
    """A ban for forged or corrupted work (``ban_event_id``), or a validator's revocation for being
    outvoted or a trainer's for a failed island audit (``role_id``), carried to the chain after the dispute window: the address's stake was
    slashed (``amount`` base units; "0" when it had none left), citing ``submissions``."""

    __tablename__ = "slashings"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    address: Mapped[str] = mapped_column(String(42), index=True)
    ban_event_id: Mapped[int | None] = mapped_column(Integer, ForeignKey("node_status_events.id"), unique=True)
    role_id: Mapped[int | None] = mapped_column(Integer, ForeignKey("roles.id"), unique=True)
    evidence: Mapped[str] = mapped_column(String(66))
    """keccak256 of the sorted submission ids, joined by commas: what the chain's Slashed event cites."""
    submissions: Mapped[list[str]] = mapped_column(JSON)
    amount: Mapped[str] = mapped_column(String(80))
    tx_hash: Mapped[str | None] = mapped_column(String(66))
    at: Mapped[datetime]
