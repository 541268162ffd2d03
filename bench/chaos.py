"""Fault injection, long version: each fault of ``devnet.chaos.FAULTS`` on a fresh devnet (SIGKILL at
its moment, then restart), the run taken to its target step, the backlog drained, the ledger and the
trainer's checkpoint audited. Prints: scenario, recovered, time to recover, rollouts lost (must be 0),
duplicates (must be 0), submissions left unfinished (must be 0).

    python bench/chaos.py [--faults node-generation,coordinator,...] [--steps 5] [--nodes 2]
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from intellect_protocol.devnet.chaos import CHAOS_COORDINATOR_ENV, FAULTS, audit, drain, published, wait_until
from intellect_protocol.devnet.network import start_network

RUN = ["--prompts-per-task", "4", "--samples-per-prompt", "4", "--max-tokens", "48"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--faults", default=",".join(FAULTS), help="comma-separated, from: " + ", ".join(FAULTS))
    parser.add_argument("--steps", type=int, default=5, help="policy step each run must reach")
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    console = Console(width=160)  # the table stays readable when the output is redirected
    table = Table(
        "scenario", "recovered", "time to recover (s)", "rollouts lost", "duplicates", "unfinished", "ledger", "wall (s)"
    )
    failures = 0
    for name in args.faults.split(","):
        workdir = Path(tempfile.mkdtemp(prefix=f"chaos-{name}-"))
        started = time.monotonic()
        # The trainer trains until stopped: a run whose trainer is done hands out no more work.
        net = start_network(workdir, nodes=args.nodes, run_options=RUN, steps=0, coordinator_env=CHAOS_COORDINATOR_ENV)
        try:
            recovery = FAULTS[name](net, random.Random(args.seed))
            wait_until(lambda: published(net) >= args.steps, 900, f"policy step {args.steps}")  # noqa: B023
            net.by_name("trainer").stop()
            drain(net)
        finally:
            net.stop()
        result = audit(net)
        ok = (
            recovery.recovered
            and result.policy_step >= args.steps
            and not (result.lost or result.duplicates or result.unfinished or result.ledger_errors)
        )
        failures += not ok
        table.add_row(
            recovery.fault,
            "yes" if ok else "[red]NO[/red]",
            f"{recovery.recover_s:.1f}",
            str(result.lost),
            str(result.duplicates),
            str(result.unfinished),
            "ok" if not result.ledger_errors else "; ".join(result.ledger_errors)[:60],
            f"{time.monotonic() - started:.0f}",
        )
        console.print(f"{name}: done in {time.monotonic() - started:.0f} s (workdir {workdir})")
    console.print(table)
    console.print(
        f"{len(args.faults.split(',')) - failures}/{len(args.faults.split(','))} scenarios recovered with zero loss and zero duplicates"
    )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
