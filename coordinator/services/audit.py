"""The audit log: every admin action that changes something, written in the action's own transaction
(an action that fails leaves no entry; one that succeeds always does)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from intellect_protocol.coordinator.audit_models import AuditEntry
from intellect_protocol.coordinator.models import AdminToken


def record(session: Session, token: AdminToken, action: str, target: str, detail: dict[str, Any], now: datetime) -> None:
    session.add(AuditEntry(token_id=token.id, token_name=token.name, action=action, target=target, detail=detail, at=now))


def entries(session: Session, since: datetime | None, until: datetime | None, limit: int) -> list[AuditEntry]:
    """Newest first, within [since, until)."""
    query = select(AuditEntry).order_by(AuditEntry.id.desc()).limit(limit)
    if since is not None:
        query = query.where(AuditEntry.at >= since)
    if until is not None:
        query = query.where(AuditEntry.at < until)
    return list(session.scalars(query))
