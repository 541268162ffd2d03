"""Wake long-polling requests on this process the moment what they wait for happens.

Other coordinator replicas do not see the call, so waiters also look again on a timeout.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from typing import TypeVar

from starlette.requests import Request

T = TypeVar("T")

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


class Waiters:
    """Long polls waiting by key (a validator's address), each woken on its own.

    Waking every validator's long poll at every upload and verdict made each of them run a claim transaction for
    work that was drawn for one (round four's sybil flood: about 90 looks a second, 15 % of the coordinator's time)."""

    def __init__(self) -> None:
        self._wakeups: dict[str, Wakeup] = {}
        self._waiting: Counter[str] = Counter()

    async def wait(self, key: str, timeout: float) -> None:
        """Return when ``key`` is woken (:meth:`notify`), or after ``timeout``."""
        wakeup = self._wakeups.setdefault(key, Wakeup())
        self._waiting[key] += 1
        try:
            await wakeup.wait(timeout)
        finally:
            self._waiting[key] -= 1
            if not self._waiting[key]:
                del self._waiting[key], self._wakeups[key]

    def notify(self, keys: Iterable[str]) -> None:
        for key in keys:
            if key in self._wakeups:
                self._wakeups[key].notify()


async def long_poll(
    request: Request,
    first: T,
    look: Callable[[], Awaitable[T]],
    wait: Callable[[T, float], Awaitable[None]],
    done: Callable[[T], bool],
    deadline: float,
) -> T:
    """``first``, or else what ``look()`` finds after each ``wait(last found, timeout)`` (a wake-up or at most
    :data:`POLL_S`), once ``done`` or at ``deadline`` (``time.monotonic``). Nothing is looked at once the client
    has hung up: a look that claims work would take it for a caller gone, and it would wait out the claim's lease.
    ``request``'s body must have been read."""
    gone = asyncio.create_task(_until_gone(request))
    found = first
    try:
        while not done(found) and (remaining := deadline - time.monotonic()) > 0:
            waiting = asyncio.ensure_future(wait(found, min(POLL_S, remaining)))
            await asyncio.wait({waiting, gone}, return_when=asyncio.FIRST_COMPLETED)
            waiting.cancel()
            if gone.done():
                break
            found = await look()
    finally:
        gone.cancel()
    return found


async def _until_gone(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
