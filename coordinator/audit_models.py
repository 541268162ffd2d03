"""The ledger's log of admin actions (:mod:`coordinator.services.audit` writes it). Imported by ``migrations/env.py``
so the table shares the ledger's metadata."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from intellect_protocol.coordinator.models import Base


class AuditEntry(Base):
    """One admin action: which token did what to what, and when; rows are only ever added."""

    __tablename__ = "audit_log"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    token_id: Mapped[int] = mapped_column(Integer)
    token_name: Mapped[str] = mapped_column(String(128))
    action: Mapped[str] = mapped_column(String(64))
    """``router.verb``, e.g. ``nodes.ban`` or ``runs.update``."""
    target: Mapped[str] = mapped_column(String(128))
    detail: Mapped[dict[str, Any]]
    at: Mapped[datetime] = mapped_column(index=True)
