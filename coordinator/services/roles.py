"""Roles an admin grants: who may validate, train (publish manifests) or serve as a relay."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from intellect_protocol.coordinator import events
from intellect_protocol.coordinator.errors import ApiError
from intellect_protocol.coordinator.models import Role
from intellect_protocol.shared.schemas import ErrorCode, RoleName


def active(session: Session, address: str, role: RoleName) -> Role | None:
    return session.scalar(select(Role).where(Role.address == address, Role.role == role, Role.revoked_at.is_(None)))


def grant(session: Session, address: str, role: RoleName, granted_by: str, now: datetime) -> Role:
    """Grant ``role`` (idempotent: an active grant is returned as it is)."""
    row = active(session, address, role)
    if row is None:
        row = Role(address=address, role=role, granted_by=granted_by, granted_at=now)
        session.add(row)
        session.flush()
    return row


def revoke(session: Session, address: str, role: RoleName, now: datetime) -> Role:
    row = active(session, address, role)
    if row is None:
        raise ApiError(ErrorCode.not_found, f"{address} does not hold the {role} role.")
    row.revoked_at = now
    row.revoke_reason = "revoked by an admin"
    events.after_commit(session, "%s lost its %s role: %s", address, role, row.revoke_reason)
    return row


def holders(session: Session, role: RoleName) -> list[str]:
    return list(session.scalars(select(Role.address).where(Role.role == role, Role.revoked_at.is_(None)).order_by(Role.id)))


def active_roles(session: Session) -> list[Role]:
    return list(session.scalars(select(Role).where(Role.revoked_at.is_(None)).order_by(Role.id)))


def require(session: Session, address: str, role: RoleName) -> Role:
    """``address``'s grant of ``role``; 403 when it holds none (never granted, or revoked, and why)."""
    row = active(session, address, role)
    if row is None:
        last = session.scalar(select(Role).where(Role.address == address, Role.role == role).order_by(Role.id.desc()).limit(1))
        why = f": revoked, {last.revoke_reason}" if last is not None and last.revoke_reason else " (an admin grants it)"
        raise ApiError(ErrorCode.role_required, f"{address} does not hold the {role} role{why}.")
    return row
