"""Ledger tables of weight broadcast: each policy step's signed manifest, the shardcast servers
(relays and the trainer's origin), and clients' reports of bad chunks. Imported by
``migrations/env.py`` so the tables share the ledger's metadata."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, ForeignKey, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from intellect_protocol.coordinator.models import Base


class PolicyManifest(Base):
    """A policy step's signed shardcast manifest, as the trainer posted it (the JSON is what was signed)."""

    __tablename__ = "manifests"
    __table_args__ = (UniqueConstraint("run_id", "step"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(String(64), ForeignKey("runs.id"))
    step: Mapped[int] = mapped_column(Integer)
    signer: Mapped[str] = mapped_column(String(42))
    digest: Mapped[str] = mapped_column(String(64))
    total_bytes: Mapped[int] = mapped_column(BigInteger)
    body: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime]


class Relay(Base):
    """A shardcast server (a relay, or the trainer's origin) and where to reach it."""

    __tablename__ = "relays"

    address: Mapped[str] = mapped_column(String(42), primary_key=True)
    url: Mapped[str] = mapped_column(String(512))
    kind: Mapped[str] = mapped_column(String(16))
    """``relay`` or ``origin``."""
    registered_at: Mapped[datetime]
    last_seen: Mapped[datetime]


class RelayReport(Base):
    """A client's report that a relay served bytes that did not match the manifest, or failed."""

    __tablename__ = "relay_reports"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    relay_url: Mapped[str] = mapped_column(String(512), index=True)
    reporter: Mapped[str] = mapped_column(String(42))
    run_id: Mapped[str] = mapped_column(String(64))
    step: Mapped[int] = mapped_column(Integer)
    chunk: Mapped[int] = mapped_column(Integer)
    reason: Mapped[str] = mapped_column(String(32))
    created_at: Mapped[datetime]
