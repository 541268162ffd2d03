"""A small async cache: values kept for a time per key, and one computation per key at a time.

Concurrent misses of one key wait for the same computation instead of each recomputing (a burst
of heartbeats after a restart asks the ledger once). A computation that fails is not kept; every
caller waiting on it gets its exception. At most ``max_keys`` keys are kept (the oldest go first),
so callers that name keys (addresses) cannot grow it without bound.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class TtlCache(Generic[K, V]):
    def __init__(self, ttl_s: float | Callable[[V], float], max_keys: int = 10_000) -> None:
        """``ttl_s``: seconds a value stays fresh, or a function of the value giving them."""
        self._ttl = ttl_s if callable(ttl_s) else (lambda _: ttl_s)
        self._max_keys = max_keys
        self._values: dict[K, tuple[float, V]] = {}
        self._computing: dict[K, asyncio.Future[V]] = {}

    def fresh(self, key: K) -> V | None:
        """``key``'s value if it is still fresh."""
        hit = self._values.get(key)
        if hit is None or time.monotonic() - hit[0] >= self._ttl(hit[1]):
            return None
        return hit[1]

    def last(self, key: K) -> V | None:
        """``key``'s last value, however old (for when a new one cannot be had)."""
        hit = self._values.get(key)
        return None if hit is None else hit[1]

    async def get(self, key: K, compute: Callable[[], Awaitable[V]]) -> V:
        """``key``'s fresh value, computed by ``compute`` if there is none (once, however many ask)."""
        hit = self._values.get(key)
        if hit is not None and time.monotonic() - hit[0] < self._ttl(hit[1]):
            return hit[1]
        running = self._computing.get(key)
        if running is not None:
            return await asyncio.shield(running)
        future: asyncio.Future[V] = asyncio.get_running_loop().create_future()
        self._computing[key] = future
        try:
            value = await compute()
        except asyncio.CancelledError:
            future.cancel()
            raise
        except BaseException as e:
            future.set_exception(e)
            future.exception()  # retrieved here: nobody waiting is not an error
            raise
        else:
            future.set_result(value)
            self._store(key, value)
            return value
        finally:
            del self._computing[key]

    def _store(self, key: K, value: V) -> None:
        self._values.pop(key, None)
        self._values[key] = (time.monotonic(), value)
        while len(self._values) > self._max_keys:
            del self._values[next(iter(self._values))]
