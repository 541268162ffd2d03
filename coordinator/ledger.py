"""The unit of work: a function run in one database transaction on a worker thread.

Endpoints are async and hand their database work here in one piece, so a request costs one
thread hop rather than one per dependency. The work runs on the ledger's own small thread
pool, not the framework's 40-thread one: with SQLite every write is serialised anyway, and
dozens of threads queueing for one lock spend their time handing the GIL around. For a signed request the nonce is recorded in
the same transaction as the request's effects: a rejected request records nothing, and an
accepted one can never be replayed.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Concatenate, ParamSpec, TypeVar

from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session, sessionmaker

from intellect_protocol.coordinator.clock import Clock, system_clock
from intellect_protocol.coordinator.services.nonces import record_nonce
from intellect_protocol.coordinator.signed import SignedRequest

log = logging.getLogger(__name__)

RETRIED = frozenset({"40P01", "40001"})
"""PostgreSQL's deadlock_detected and serialization_failure: it rolled the transaction back, so
running it again is safe (two verdicts and a claim may lock rows in different orders)."""
ATTEMPTS = 3

P = ParamSpec("P")
T = TypeVar("T")


class Ledger:
    def __init__(self, sessions: sessionmaker[Session], threads: int, clock: Clock = system_clock) -> None:
        self.sessions = sessions
        self.now = clock
        """The coordinator's clock (:mod:`coordinator.clock`): what routes record and judge deadlines by."""
        self.executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="ledger") if threads else None

    def close(self) -> None:
        if self.executor is not None:
            self.executor.shutdown(wait=True)

    async def _in_thread(self, fn: Callable[..., T], *args: object) -> T:
        if self.executor is None:
            return fn(*args)
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    def run_sync(self, fn: Callable[Concatenate[Session, P], T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run ``fn(session, ...)`` in a transaction: committed if it returns, rolled back if it raises.
        A transaction PostgreSQL aborted to break a deadlock (or a serialization conflict) is run again."""
        attempt = 1
        while True:
            try:
                with self.sessions.begin() as session:
                    return fn(session, *args, **kwargs)
            except DBAPIError as e:
                if getattr(e.orig, "sqlstate", None) not in RETRIED or attempt == ATTEMPTS:
                    raise
                log.warning("transaction aborted by the database (%s); running it again", e.orig.sqlstate)  # type: ignore[union-attr]
                attempt += 1

    async def run(self, fn: Callable[Concatenate[Session, P], T], *args: P.args, **kwargs: P.kwargs) -> T:
        return await self._in_thread(functools.partial(self.run_sync, fn, *args, **kwargs))

    async def run_signed(
        self, signed: SignedRequest, fn: Callable[Concatenate[Session, str, P], T], *args: P.args, **kwargs: P.kwargs
    ) -> T:
        """Run ``fn(session, signer_address, ...)`` after recording the request's nonce in the same transaction."""

        def work(session: Session) -> T:
            record_nonce(session, signed.address, signed.nonce, datetime.now(UTC))
            return fn(session, signed.address, *args, **kwargs)

        return await self._in_thread(self.run_sync, work)
