"""The ledger's notable events (bans, revoked roles, published policy steps) in the coordinator's
log, written only once the transaction that made them commits: a transaction the database aborts
and runs again, or one that fails, logs nothing."""

from __future__ import annotations

import logging

from sqlalchemy import event
from sqlalchemy.orm import Session

log = logging.getLogger("intellect.coordinator")
_KEY = "events_after_commit"


def after_commit(session: Session, message: str, *args: object) -> None:
    """Log ``message % args`` at INFO once ``session``'s transaction commits."""
    session.info.setdefault(_KEY, []).append((message, args))


@event.listens_for(Session, "after_commit")
def _emit(session: Session) -> None:
    for message, args in session.info.pop(_KEY, []):
        log.info(message, *args)


@event.listens_for(Session, "after_soft_rollback")
def _drop(session: Session, _previous: object) -> None:
    if not session.in_transaction():  # the whole transaction, not a savepoint within it
        session.info.pop(_KEY, None)
