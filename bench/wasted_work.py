"""Honest compute thrown away as stale, and how busy the validator is, in a long devnet run.

Each configuration runs ``intellect-devnet --steps 0 --nodes 2 --validators 1`` for
``--minutes`` (10 by default) on an SQLite ledger, then stops it with SIGINT and reads the ledger:

- **expired share**: tokens of honest rollout files that went stale before their validators
  finished (status ``expired``, or a rejection citing the run's window, as older code labelled
  them) over the tokens of every file uploaded;
- **validator utilisation**: the share of the run the validator spent on claimed work (from a
  review's claim to its verdict), and the share of the time work waited for it (a file uploaded
  and not yet decided) while it held nothing.

``--before REV`` first runs the same devnet from a git worktree of REV (the code before the fix),
so both figures come from one run of this benchmark. Everything is written under a temp dir.

    python bench/wasted_work.py [--minutes 10] [--before REV]
"""

from __future__ import annotations

import argparse
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _worktree import worktree  # noqa: E402

from intellect_protocol.devnet.processes import script  # noqa: E402


@dataclass
class Waste:
    files: int
    tokens: int
    expired_tokens: int
    accepted: int
    utilisation: float
    idle_while_waiting: float
    """Share of the time work waited for a verdict that the validator held no claim."""
    policy_step: int

    @property
    def expired_share(self) -> float:
        return self.expired_tokens / self.tokens if self.tokens else 0.0


def _times(value: str | None) -> float | None:
    return None if value is None else datetime.fromisoformat(value).timestamp()


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _length(intervals: list[tuple[float, float]]) -> float:
    return sum(end - start for start, end in intervals)


def _intersect(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    total, i, j = 0.0, 0, 0
    while i < len(a) and j < len(b):
        total += max(0.0, min(a[i][1], b[j][1]) - max(a[i][0], b[j][0]))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def measure(ledger: Path) -> Waste:
    db = sqlite3.connect(ledger)
    subs = db.execute("SELECT tokens, status, reason, created_at, validated_at FROM submissions").fetchall()
    expired = sum(
        t
        for t, status, reason, *_ in subs
        if status == "expired" or (status == "rejected" and "outside the run's window" in (reason or ""))
    )
    reviews = db.execute(
        "SELECT claimed_at, judged_at FROM reviews WHERE claimed_at IS NOT NULL AND judged_at IS NOT NULL"
    ).fetchall()
    busy = _union([(_times(c), _times(j)) for c, j in reviews])
    start = min(_times(c) for *_, c, _ in subs)
    end = max(_times(v) or _times(c) for *_, c, v in subs)
    waiting = _union([(_times(c), _times(v) or end) for *_, c, v in subs])
    step = db.execute("SELECT max(policy_step) FROM runs").fetchone()[0]
    return Waste(
        files=len(subs),
        tokens=sum(t for t, *_ in subs),
        expired_tokens=expired,
        accepted=sum(1 for _, status, *_ in subs if status == "accepted"),
        utilisation=_length(busy) / (end - start),
        idle_while_waiting=1 - _intersect(waiting, busy) / _length(waiting),
        policy_step=step,
    )


def run_devnet(source: Path, workdir: Path, minutes: float) -> Waste:
    # The installed script, importing ``source`` first: its roles' scripts inherit the path too.
    command = [*script("intellect-devnet"), "--steps", "0", "--nodes", "2", "--validators", "1", "--workdir", str(workdir)]
    env = {**os.environ, "PYTHONPATH": str(source)}
    with open(workdir.parent / f"{workdir.name}.log", "wb") as log:
        devnet = subprocess.Popen(command, cwd=source, env=env, stdout=log, stderr=subprocess.STDOUT)
        time.sleep(minutes * 60)
        devnet.send_signal(signal.SIGINT)
        devnet.wait(120)
    return measure(workdir / "ledger.db")


def report(name: str, waste: Waste) -> None:
    print(
        f"  {name:<7} {waste.files:>5} files, {waste.accepted:>5} accepted, policy step {waste.policy_step:>3}; "
        f"expired {waste.expired_tokens:>7} of {waste.tokens:>8} tokens ({waste.expired_share:6.2%}); "
        f"validator busy {waste.utilisation:6.1%}, idle while work waited {waste.idle_while_waiting:6.1%}",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=10.0, help="How long each devnet runs.")
    parser.add_argument("--before", help="A git revision whose devnet runs first, as the baseline.")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-wasted-") as tmp:
        results: dict[str, Waste] = {}
        print(f"intellect-devnet --steps 0 --nodes 2 --validators 1, {args.minutes:g} minutes each, SQLite ledger", flush=True)
        if args.before:
            with worktree(args.before, Path(tmp) / "before-src") as source:
                results["before"] = run_devnet(source, Path(tmp) / "before", args.minutes)
                report("before", results["before"])
        results["after"] = run_devnet(ROOT, Path(tmp) / "after", args.minutes)
        report("after", results["after"])
        if "before" in results:
            b, a = results["before"], results["after"]
            ratio = f"{b.expired_share / a.expired_share:.1f}x less" if a.expired_share else "none left"
            print(
                f"expired share {b.expired_share:.2%} -> {a.expired_share:.2%} ({ratio}); validator idle while work waited {b.idle_while_waiting:.1%} -> {a.idle_while_waiting:.1%}"
            )


if __name__ == "__main__":
    main()
