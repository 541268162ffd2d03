"""What ``bench/upload_memory.py`` watches while hostile clients flood a coordinator: the
coordinator's peak resident memory, and an honest node's heartbeat latency beside the flood."""

from __future__ import annotations

import statistics
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
from eth_account import Account
from load import register

from intellect_protocol.shared.signing import SignedAuth
from intellect_protocol.shared.version import __version__


class Background:
    """``_run`` on a thread inside a ``with`` block; it should return once ``done`` is set."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        raise NotImplementedError

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.done.set()
        self.thread.join()


class Sampler(Background):
    """Peak resident memory of ``pid`` while in the ``with`` block."""

    def __init__(self, pid: int) -> None:
        super().__init__()
        self.pid, self.peak = pid, 0

    def rss(self) -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError("no VmRSS")

    def _run(self) -> None:
        while not self.done.is_set():
            self.peak = max(self.peak, self.rss())
            time.sleep(0.02)


class Heartbeats(Background):
    """A registered node heartbeating from 127.0.0.2 every 0.1 s; latencies and statuses."""

    def __init__(self, url: str, audience: str) -> None:
        super().__init__()
        self.account = Account.create()
        register(url, [self.account], audience)
        self.client = httpx.Client(base_url=url, timeout=60, transport=httpx.HTTPTransport(local_address="127.0.0.2"))
        self.auth = SignedAuth(self.account, audience)
        self.latencies: list[float] = []
        self.statuses: Counter[int] = Counter()

    def _run(self) -> None:
        body = {
            "address": self.account.address,
            "client_version": __version__,
            "activity": "generating",
            "metrics": {},
            "weights": {},
        }
        while not self.done.is_set():
            started = time.perf_counter()
            status = self.client.post("/v1/nodes/heartbeat", json=body, auth=self.auth).status_code
            self.latencies.append(time.perf_counter() - started)
            self.statuses[status] += 1
            self.done.wait(0.1)

    def summary(self) -> str:
        lat = sorted(self.latencies)
        p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))]
        return f"p50 {statistics.median(lat) * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms, {dict(self.statuses)}"
