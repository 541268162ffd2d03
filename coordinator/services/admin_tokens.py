"""Admin bearer tokens: ``ipa_<id>_<secret>``, shown once, only the secret's sha256 stored."""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from intellect_protocol.coordinator.models import AdminToken
from intellect_protocol.shared.schemas import Scope

SCOPES = tuple(Scope)
"""Each scope includes the ones before it."""
TOKEN_PATTERN = re.compile(r"ipa_(\d{1,18})_([A-Za-z0-9_-]{43})")


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def create_token(session: Session, name: str, scope: str, now: datetime) -> tuple[AdminToken, str]:
    """Store a new token; returns the row and the plaintext, which is never stored."""
    if scope not in SCOPES:
        raise ValueError(f"scope must be one of {', '.join(SCOPES)}")
    secret = secrets.token_urlsafe(32)
    row = AdminToken(name=name, secret_sha256=_digest(secret), scopes=scope, created_at=now)
    session.add(row)
    session.flush()
    return row, f"ipa_{row.id}_{secret}"


def verify_token(session: Session, token: str) -> AdminToken | None:
    """The live token row this plaintext matches, or None; the comparison takes constant time."""
    match = TOKEN_PATTERN.fullmatch(token)
    if match is None:
        return None
    row = session.get(AdminToken, int(match.group(1)))
    expected = row.secret_sha256 if row is not None else "0" * 64
    ok = hmac.compare_digest(expected, _digest(match.group(2)))
    if row is None or row.revoked_at is not None or not ok:
        return None
    return row


def has_scope(row: AdminToken, needed: str) -> bool:
    return SCOPES.index(row.scopes) >= SCOPES.index(needed)


def revoke_token(session: Session, token_id: int, now: datetime) -> AdminToken | None:
    row = session.get(AdminToken, token_id)
    if row is not None and row.revoked_at is None:
        row.revoked_at = now
    return row


def list_tokens(session: Session) -> list[AdminToken]:
    return list(session.scalars(select(AdminToken).order_by(AdminToken.id)))
