"""Wake long-polling requests on this process the moment what they wait for happens.

Other coordinator replicas do not see the call, so waiters also look again on a timeout.
"""

from __future__ import annotations

import asyncio

POLL_S = 2.0
"""How often a long poll looks again without a wake-up: what another replica changed shows within this.
A look is a whole claim or read transaction; at 0.5 s, two idle validators' looks were a fifth of a
devnet coordinator's CPU (measured with py-spy), while this process's own changes wake them at once."""


class Wakeup:
    """``notify()`` wakes every current ``wait()``; later waiters wait for the next one."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def notify(self) -> None:
        woken, self._event = self._event, asyncio.Event()
        woken.set()

    async def wait(self, timeout: float) -> None:
        """Return at the next ``notify()``, or after ``timeout`` seconds."""
        try:
            await asyncio.wait_for(self._event.wait(), timeout)
        except TimeoutError:
            pass
