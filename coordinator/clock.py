"""The coordinator's clock: every time it records in the ledger or judges a ledger deadline by (leases,
claims, liveness, windows, staleness, dispute windows) is read from the one clock of its
:class:`~coordinator.context.Context`, so a test can move time instead of sleeping through it.

Two things keep to the wall clock, because parties outside the coordinator share them: the signature
window and the nonces kept for it (a node's clock), and the epochs anchored on a chain (the chain's block times).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

Clock = Callable[[], datetime]
"""Returns the current time, timezone-aware (UTC)."""


def system_clock() -> datetime:
    return datetime.now(UTC)
