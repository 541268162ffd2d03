"""What a devnet's ledger and coordinator say about a window of its run: when work began, rows accepted, verdicts
given by purpose, the policy steps published. ``bench/learning.py`` reads its networks through these."""

from __future__ import annotations

import time

import httpx
from sqlalchemy import Engine, func, select

from intellect_protocol.coordinator.models import Review, Submission, Task
from intellect_protocol.shared.states import SubmissionStatus


def first_lease(ledger: Engine, timeout: float = 300) -> float:
    """When the run's first task was leased (waiting for it)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        with ledger.connect() as db:
            first = db.scalar(select(func.min(Task.leased_at)))
        if first is not None:
            return first.timestamp()
        time.sleep(0.2)
    raise RuntimeError(f"no task was leased in {timeout:.0f} s")


def accepted_rows(ledger: Engine) -> int:
    with ledger.connect() as db:
        return int(
            db.scalar(select(func.coalesce(func.sum(Submission.rows), 0)).where(Submission.status == SubmissionStatus.accepted))
        )


def reviews(ledger: Engine, start: float, middle: float, end: float) -> dict[str, tuple[int, int]]:
    """Verdicts given in [start, middle) and in [middle, end), by purpose (first look, audit, ...)."""
    halves: dict[str, list[int]] = {}
    with ledger.connect() as db:
        for purpose, judged in db.execute(select(Review.purpose, Review.judged_at).where(Review.judged_at.is_not(None))):
            at = judged.timestamp()
            if start <= at < end:
                halves.setdefault(purpose, [0, 0])[at >= middle] += 1
    return {purpose: (first, second) for purpose, (first, second) in sorted(halves.items())}


def manifests(url: str, run: str) -> list[dict]:
    reply = httpx.get(f"{url}/v1/manifests/{run}/latest", timeout=30)
    latest = reply.json()["step"] if reply.status_code == 200 else 0
    return [httpx.get(f"{url}/v1/manifests/{run}/{step}", timeout=30).json() for step in range(1, latest + 1)]
