"""Background loops: each runs in its own thread and records when it last finished a pass,
so ``/healthz`` can tell a live loop from a dead or stuck one."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)


class Loop:
    def __init__(self, name: str, interval_s: float, tick: Callable[[], None]) -> None:
        self.name = name
        self.interval_s = interval_s
        self.tick = tick
        self.last_ok: float | None = None
        self.last_error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"loop-{name}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.tick()
                self.last_ok = time.monotonic()
                self.last_error = None
            except Exception as e:  # a failed pass is retried next interval and shows in /healthz
                self.last_error = f"{type(e).__name__}: {e}"
                log.exception("background loop %s failed", self.name)
            self._stop.wait(self.interval_s)

    def health(self) -> dict[str, object]:
        age = None if self.last_ok is None else time.monotonic() - self.last_ok
        alive = self._thread.is_alive() and age is not None and age < max(3 * self.interval_s, 5.0)
        return {"alive": alive, "last_ok_age_s": age, "last_error": self.last_error}
