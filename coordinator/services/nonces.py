"""The replay guard: each (address, nonce) may be used once while its signature could be valid."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, cast

from sqlalchemy import CursorResult, delete, insert
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from intellect_protocol.coordinator.errors import ApiError
from intellect_protocol.coordinator.models import Nonce
from intellect_protocol.shared.schemas import ErrorCode

_INSERT = insert(Nonce)


def record_nonce(session: Session, address: str, nonce: str, now: datetime) -> None:
    """Add the nonce to the caller's transaction; a reuse raises 401 ``nonce_reused``.

    The row commits together with whatever the request changes, so a rejected request
    records nothing, not even its nonce.
    """
    try:
        # On the connection, not the ORM session: every signed request passes here, and the
        # ORM's execution path costs more than the statement itself.
        session.connection().execute(_INSERT, {"address": address, "nonce": nonce, "seen_at": now})
    except IntegrityError:
        session.rollback()
        raise ApiError(ErrorCode.nonce_reused, "This request's nonce was already used; sign a fresh request.") from None


def prune_nonces(session: Session, now: datetime, keep_s: int) -> int:
    """Forget nonces older than ``keep_s``: their signatures' timestamps are out of the window."""
    result = session.execute(delete(Nonce).where(Nonce.seen_at < now - timedelta(seconds=keep_s)))
    return cast(CursorResult[Any], result).rowcount or 0
