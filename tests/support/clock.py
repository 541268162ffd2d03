"""A coordinator clock a test moves by hand (``serve(settings, clock=clock)``): it jumps past a lease, a
liveness window or a dispute window at once, instead of sleeping and racing a loaded machine's scheduler."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta


class MovableClock:
    """The wall clock plus whatever :meth:`advance` added: time still flows, for long polls and loops."""

    def __init__(self) -> None:
        self.offset = timedelta(0)

    def __call__(self) -> datetime:
        return datetime.now(UTC) + self.offset

    def advance(self, seconds: float) -> None:
        self.offset += timedelta(seconds=seconds)
