"""The protocol-tax ledger of ``bench/learning.py``: CPU seconds by role and activity over a window
of a devnet's run, each from the process's own CPU time.

A role's total is its process's user and system time (as its own ledger file last read it, so that it agrees
with the activities written with it; from ``/proc`` where it writes none) and its reaped children's, plus its
helpers' (a node's finisher process); its activities come from the :mod:`shared.cpu_ledger` files every process
writes when ``INTELLECT_CPU_LEDGER`` is set, and "other" is what no activity covers."""

from __future__ import annotations

import os
from collections import defaultdict
from pathlib import Path

from intellect_protocol.devnet.network import Network
from intellect_protocol.shared.cpu_ledger import read_ledgers

Ledger = dict[str, dict[str, float]]
"""Role -> activity -> CPU seconds; every role's ``total`` is its whole CPU time."""
TOTAL, OTHER = "total", "other"
LEARNING = {("node", "generation"), ("trainer", "forward/backward"), ("trainer", "optimizer")} | {
    ("single process", activity) for activity in ("generation", "forward/backward", "optimizer")
}
"""What is not tax: generating rollouts and the training update; everything else is."""
LEARNERS = {role for role, _ in LEARNING}


def _process_cpu(pid: int, own_s: float | None = None) -> float:
    """User and system seconds of ``pid`` and its reaped children; ``own_s``: the process's own, as its ledger read
    them at the instant it wrote its activities (so the two agree, where /proc would be up to a flush later)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = [int(v) / os.sysconf("SC_CLK_TCK") for v in fields[11:15]]
    return (sum(ticks[:2]) if own_s is None else own_s) + sum(ticks[2:])


def _role(name: str) -> str:
    if name.startswith("node-"):
        return "node"
    if name.startswith("validator-"):
        return "validators"
    return "relay and origin" if name in ("relay", "origin") else name


def take(net: Network, directory: Path) -> Ledger:
    """Every role's CPU seconds so far."""
    snapshots = read_ledgers(directory) if directory.exists() else []
    ledger: defaultdict[str, defaultdict[str, float]] = defaultdict(lambda: defaultdict(float))
    for process in net.processes:
        role, pid = _role(process.name), process.popen.pid
        own = next((s.cpu_s for s in snapshots if s.pid == pid), None)
        ledger[role][TOTAL] += _process_cpu(pid, own)
        for s in snapshots:
            if s.parent == pid:  # a helper: not in the role's own /proc time until it exits
                ledger[role][TOTAL] += s.cpu_s
            if pid in (s.pid, s.parent):
                for activity, seconds in s.activities.items():
                    ledger[role][activity] += seconds
    return {role: dict(activities) for role, activities in ledger.items()}


def difference(end: Ledger, start: Ledger) -> Ledger:
    """What was spent between two ledgers, with each role's ``other``."""
    out: Ledger = {}
    for role, activities in end.items():
        spent = {a: s - start.get(role, {}).get(a, 0.0) for a, s in activities.items()}
        spent[OTHER] = spent[TOTAL] - sum(s for a, s in spent.items() if a != TOTAL)
        out[role] = spent
    return out


def tax(ledger: Ledger) -> float | None:
    """The share of all CPU seconds that is neither generation nor the training update; None where a role that
    generates or trains recorded neither (its ledger is missing, and every second of it would read as tax)."""
    everything = sum(activities[TOTAL] for activities in ledger.values())
    learnt = {role: sum(s for a, s in activities.items() if (role, a) in LEARNING) for role, activities in ledger.items()}
    if not everything or any(role in LEARNERS and not s for role, s in learnt.items()):
        return None
    return 1 - sum(learnt.values()) / everything


def show(ledger: Ledger, rollouts: int) -> None:
    """CPU milliseconds per rollout by role and activity, largest first; tax lines marked ``*``."""
    everything = sum(activities[TOTAL] for activities in ledger.values())
    print(f"  CPU per accepted rollout ({rollouts} rollouts, {everything:.1f} CPU s; * = protocol tax):")
    for role, activities in sorted(ledger.items(), key=lambda item: -item[1][TOTAL]):
        parts = sorted(((a, s) for a, s in activities.items() if a != TOTAL), key=lambda item: -item[1])
        listed = ", ".join(
            f"{'' if (role, a) in LEARNING else '*'}{a} {1000 * s / max(rollouts, 1):.1f}"
            for a, s in parts
            if s >= 0.0005 * everything
        )
        print(
            f"    {role:<17} {1000 * activities[TOTAL] / max(rollouts, 1):7.1f} ms ({100 * activities[TOTAL] / everything:4.1f} %): {listed}"
        )
    share = tax(ledger)
    measured = "not measured: a role's ledger is missing" if share is None else f"{100 * share:.1f} % of all CPU seconds"
    print(f"  protocol tax: {measured}")
