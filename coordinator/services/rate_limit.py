"""Per-key token buckets, held in this process's memory.

Each coordinator replica limits on its own, so N replicas allow up to N times the rate.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict


class RateLimiter:
    def __init__(self, rate_per_s: float, burst: int, max_keys: int = 100_000) -> None:
        self.rate_per_s = rate_per_s
        self.burst = burst
        self.max_keys = max_keys
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()
        self._lock = threading.Lock()

    def acquire(self, key: str, now: float | None = None) -> float:
        """Take one token for ``key``; returns 0 when allowed, else seconds until one is free."""
        now = time.monotonic() if now is None else now
        with self._lock:
            tokens, last = self._buckets.pop(key, (float(self.burst), now))
            tokens = min(float(self.burst), tokens + (now - last) * self.rate_per_s)
            wait = 0.0
            if tokens >= 1.0:
                tokens -= 1.0
            else:
                wait = (1.0 - tokens) / self.rate_per_s
            self._buckets[key] = (tokens, now)
            if len(self._buckets) > self.max_keys:
                # The least recently seen key is the one whose bucket has had longest to refill.
                self._buckets.popitem(last=False)
            return wait
