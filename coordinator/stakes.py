"""Nodes' stakes, read from the chain's stake registry for the lease check, cached per address.

A read costs one RPC per address per ``ttl_s`` (a zero stake is read again after ``RETRY_S``:
a node that just staked waits seconds, not a minute). When the chain cannot be read, the last value
known stands; an address never read waits (503 with Retry-After) rather than being refused or
let in on a guess. Reads run in a worker thread: the event loop never waits on the chain.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from intellect_protocol.coordinator.cache import TtlCache

log = logging.getLogger(__name__)

RETRY_S = 5.0


class StakeBook:
    def __init__(self, chain: Callable[[], Any], ttl_s: float = 60.0) -> None:
        self._chain = chain
        self._known: TtlCache[str, int] = TtlCache(lambda stake: ttl_s if stake else RETRY_S)
        self._failed_at = -1e9

    async def stake(self, address: str) -> int | None:
        """``address``'s active stake in token base units; None if it was never read and cannot be now."""
        fresh = self._known.fresh(address)
        if fresh is not None:
            return fresh
        if time.monotonic() - self._failed_at < RETRY_S:  # down a moment ago: no request waits on it again so soon
            return self._known.last(address)

        async def read() -> int:
            return int(await asyncio.to_thread(lambda: self._chain().stake_of(address)))

        try:
            return await self._known.get(address, read)
        except Exception as e:  # the chain is down: the last known stake stands
            self._failed_at = time.monotonic()
            log.warning("cannot read the stake of %s: %s", address, e)
            return self._known.last(address)
