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

log = logging.getLogger(__name__)

RETRY_S = 5.0


class StakeBook:
    def __init__(self, chain: Callable[[], Any], ttl_s: float = 60.0) -> None:
        self._chain = chain
        self._ttl_s = ttl_s
        self._known: dict[str, tuple[float, int]] = {}
        self._failed_at = -1e9

    async def stake(self, address: str) -> int | None:
        """``address``'s active stake in token base units; None if it was never read and cannot be now."""
        hit = self._known.get(address)
        if hit is not None and time.monotonic() - hit[0] < (self._ttl_s if hit[1] else RETRY_S):
            return hit[1]
        if time.monotonic() - self._failed_at < RETRY_S:  # down a moment ago: no request waits on it again so soon
            return None if hit is None else hit[1]
        try:
            value = int(await asyncio.to_thread(lambda: self._chain().stake_of(address)))
        except Exception as e:  # the chain is down: the last known stake stands
            self._failed_at = time.monotonic()
            log.warning("cannot read the stake of %s: %s", address, e)
            return None if hit is None else hit[1]
        self._known[address] = (time.monotonic(), value)
        return value
