"""Fault injection on a running devnet, and the audit that proves nothing was lost.

Each fault SIGKILLs one or more roles at a chosen moment and starts them again. Afterwards
:func:`audit` reads the ledger and the trainer's checkpoint: every accepted rollout the trainer
reached was used exactly once (its consumed cursor ranges tile the ledger with no gap or
overlap), every submission ends accepted or rejected, and credit exists only for accepted work.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx
from sqlalchemy import create_engine, func, select

from devnet.network import Network
from devnet.processes import Process

CHAOS_COORDINATOR_ENV = {"INTELLECT_VALIDATION_CLAIM_S": "10", "INTELLECT_TASK_LEASE_S": "20"}
"""Short claims and leases, so work held by a killed role returns to the queue within seconds."""


@dataclass
class Recovery:
    fault: str
    recovered: bool
    recover_s: float
    """From the kill until the run made progress again (a new verdict, or a new policy step for the trainer)."""


@dataclass
class Audit:
    policy_step: int
    lost: int
    """Accepted rollouts inside the trainer's reach that it never read."""
    duplicates: int
    """Accepted rollouts read twice, or credited twice."""
    unfinished: int
    """Submissions still pending after the drain."""
    ledger_errors: list[str]


def _get(net: Network, path: str) -> dict | list:
    return httpx.get(f"{net.coordinator.url}{path}", headers={"authorization": f"Bearer {net.token}"}, timeout=10).json()


def published(net: Network) -> int:
    try:
        reply = httpx.get(f"{net.coordinator.url}/v1/manifests/{net.run_id}/latest", timeout=5)
    except httpx.HTTPError:
        return 0
    return reply.json()["step"] if reply.status_code == 200 else 0


def _submissions(net: Network) -> dict[str, int]:
    return _get(net, f"/v1/public/runs/{net.run_id}/progress")["submissions"]  # type: ignore[index,return-value]


def verdicts(net: Network) -> int:
    stats = _submissions(net)
    return stats["accepted"] + stats["rejected"]


def pending(net: Network) -> int:
    return _submissions(net)["pending"]


def claimed(net: Network) -> bool:
    return any(s["claimed_by"] for s in _get(net, "/v1/admin/submissions?status=pending&limit=50"))  # type: ignore[index]


def wait_until(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if check():
                return
        except httpx.HTTPError:
            pass  # the coordinator may be down on purpose
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout:.0f} s for {what}")
        time.sleep(0.1)


def _kill_restart(net: Network, names: list[str], progress: Callable[[], int], fault: str, timeout: float) -> Recovery:
    before = progress()
    killed_at = time.monotonic()
    processes: list[Process] = [net.by_name(n) for n in names]
    for p in processes:
        p.kill()
    time.sleep(0.5)
    for p in processes:
        p.restart()
    try:
        wait_until(lambda: progress() > before, timeout, f"progress after {fault}")
    except TimeoutError:
        return Recovery(fault, False, time.monotonic() - killed_at)
    return Recovery(fault, True, time.monotonic() - killed_at)


def _node_activity(net: Network, name: str) -> str:
    address = (net.workdir / "wallets" / f"{name}.json").read_text().split('"address": "')[1][:40]
    node = _get(net, f"/v1/admin/nodes/0x{address}")
    return ((node.get("last_heartbeat") or {}).get("activity")) or ""  # type: ignore[union-attr]


def node_mid_generation(net: Network, rng: random.Random) -> Recovery:
    wait_until(lambda: _node_activity(net, "node-0") == "generating", 120, "node-0 generating")
    time.sleep(rng.uniform(0, 1))
    return _kill_restart(net, ["node-0"], lambda: verdicts(net), "node mid-generation", 180)


def node_mid_upload(net: Network, rng: random.Random) -> Recovery:
    # Uploads are short; kill just as a new submission lands so the next one is in flight.
    start = pending(net)
    wait_until(lambda: pending(net) != start, 120, "an upload")
    return _kill_restart(net, ["node-0"], lambda: verdicts(net), "node mid-upload", 180)


def relay_mid_broadcast(net: Network, rng: random.Random) -> Recovery:
    step = published(net)
    wait_until(lambda: published(net) > step, 300, "a new policy step")
    return _kill_restart(net, ["relay"], lambda: verdicts(net), "relay mid-broadcast", 180)


def validator_mid_batch(net: Network, rng: random.Random) -> Recovery:
    wait_until(lambda: claimed(net), 120, "a validator claim")
    return _kill_restart(net, ["validator"], lambda: verdicts(net), "validator mid-batch", 180)


def trainer_mid_step(net: Network, rng: random.Random) -> Recovery:
    step = published(net)
    wait_until(lambda: published(net) > step, 300, "a new policy step")
    time.sleep(rng.uniform(0.2, 2.0))
    return _kill_restart(net, ["trainer"], lambda: published(net), "trainer mid-step", 300)


def trainer_mid_publish(net: Network, rng: random.Random) -> Recovery:
    origin = net.workdir / "origin" / net.run_id
    step = published(net)
    wait_until(lambda: (origin / str(step + 1)).exists(), 300, "the trainer writing its next step")
    return _kill_restart(net, ["trainer"], lambda: published(net), "trainer mid-publish", 300)


def coordinator_restart(net: Network, rng: random.Random) -> Recovery:
    time.sleep(rng.uniform(0, 2))
    return _kill_restart(net, ["coordinator"], lambda: verdicts(net), "coordinator killed, restarted on its database", 180)


def everything_at_once(net: Network, rng: random.Random) -> Recovery:
    wait_until(lambda: _node_activity(net, "node-0") == "generating", 120, "node-0 generating")
    names = ["node-0", "validator", "trainer", "relay"]
    return _kill_restart(net, names, lambda: published(net), "node, validator, trainer and relay at once", 300)


FAULTS: dict[str, Callable[[Network, random.Random], Recovery]] = {
    "node-generation": node_mid_generation,
    "node-upload": node_mid_upload,
    "relay-broadcast": relay_mid_broadcast,
    "validator-batch": validator_mid_batch,
    "trainer-step": trainer_mid_step,
    "trainer-publish": trainer_mid_publish,
    "coordinator": coordinator_restart,
    "all-at-once": everything_at_once,
}


def drain(net: Network, timeout: float = 180) -> None:
    """Stop the nodes, then let the validator finish every pending submission."""
    for p in net.processes:
        if p.name.startswith("node-"):
            p.stop()
    wait_until(lambda: pending(net) == 0, timeout, "the validation backlog to drain")


def audit(net: Network) -> Audit:
    """Read the ledger and the trainer's checkpoint (after the network stopped)."""
    import torch

    from coordinator.models import ContributionEntry, Submission
    from trainer.loop import CHECKPOINT

    state = torch.load(net.workdir / "trainer" / CHECKPOINT, weights_only=False)["state"]
    ranges: list[tuple[int, int, int]] = sorted(state["consumed"], key=lambda r: r[1])
    engine = create_engine(net.database_url)
    with engine.connect() as connection:
        credits = [c for (c,) in connection.execute(select(ContributionEntry.id).where(ContributionEntry.kind == "credit"))]
        per_submission = connection.execute(
            select(ContributionEntry.submission_id, func.count()).where(ContributionEntry.kind == "credit").group_by(ContributionEntry.submission_id)
        ).all()
        statuses = dict(connection.execute(select(Submission.id, Submission.status)).all())
        entries = connection.execute(select(ContributionEntry.submission_id, ContributionEntry.kind, ContributionEntry.units)).all()
    engine.dispose()

    covered: dict[int, int] = {}
    for _, before, after in ranges:
        for c in credits:
            if before < c <= after:
                covered[c] = covered.get(c, 0) + 1
    reach = state["cursor"]
    lost = sum(1 for c in credits if c <= reach and c not in covered)
    duplicates = sum(n - 1 for n in covered.values()) + sum(n - 1 for _, n in per_submission)
    errors = []
    net_units: dict[str, float] = {}
    for submission_id, kind, units in entries:
        net_units[submission_id] = net_units.get(submission_id, 0.0) + units
        if kind == "credit" and statuses.get(submission_id) not in ("accepted", "invalidated"):
            errors.append(f"credit for {submission_id}, which is {statuses.get(submission_id)}")
    errors += [f"clawback beyond credit on {s}" for s, u in net_units.items() if u < -1e-9]
    unfinished = sum(1 for s in statuses.values() if s == "pending")
    return Audit(state["step"], lost, duplicates, unfinished, errors)
