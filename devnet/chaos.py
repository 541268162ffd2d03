"""Fault injection on a running devnet, and the audit that proves nothing was lost.

Each fault SIGKILLs one or more roles at a chosen moment and starts them again. Afterwards
:func:`audit` reads the ledger and the trainer's checkpoint: every accepted rollout the trainer
reached was used exactly once (its consumed cursor ranges tile the ledger with no gap or
overlap), every submission ends accepted or rejected, and credit exists only for accepted work.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import httpx
from sqlalchemy import create_engine, func, select

from intellect_protocol.devnet.network import Network
from intellect_protocol.devnet.processes import Process

CHAOS_COORDINATOR_ENV = {
    "INTELLECT_VALIDATION_CLAIM_S": "10",
    "INTELLECT_TASK_LEASE_S": "20",
    "INTELLECT_MAX_VALIDATION_BACKLOG": "24",
}
"""Short claims and leases, so work held by a killed role returns to the queue within seconds; a
short validation backlog, so the drain at the end takes seconds whatever the machine's speed."""


@dataclass
class Recovery:
    fault: str
    recovered: bool
    recover_s: float
    """From the kill until the run made progress again (a new verdict, or a new policy step for the
    trainer); for a fault that is not a kill, from the fault's end (see each scenario)."""
    detail: str = ""
    """Why it did not recover, as far as the processes tell."""


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


def _get(net: Network, path: str) -> Any:
    return net.http.get(f"{net.coordinator.url}{path}", headers={"authorization": f"Bearer {net.token}"}, timeout=10).json()


def published(net: Network) -> int:
    try:
        reply = net.http.get(f"{net.coordinator.url}/v1/manifests/{net.run_id}/latest", timeout=5)
    except httpx.HTTPError:
        return 0
    return reply.json()["step"] if reply.status_code == 200 else 0


def _submissions(net: Network) -> dict[str, int]:
    counts: dict[str, int] = _get(net, f"/v1/public/runs/{net.run_id}/progress")["submissions"]
    return counts


def submitted(net: Network) -> int:
    return sum(_submissions(net).values())


def verdicts(net: Network) -> int:
    stats = _submissions(net)
    return stats["accepted"] + stats["rejected"] + stats["expired"]


def pending(net: Network) -> int:
    return _submissions(net)["pending"]


def claimed(net: Network) -> bool:
    return any(s["claimed_by"] for s in _get(net, "/v1/admin/submissions?status=pending&limit=50"))


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


def exited(net: Network) -> str:
    """The processes that have ended, with exit code and log tail: what a failure message needs."""
    gone = [p for p in net.processes if p.popen.poll() is not None]
    return "".join(f"\n{p.name} exited with {p.popen.returncode}:\n{p.tail(15)}" for p in gone) or " (every process is running)"


def _until(net: Network, progress: Callable[[], int], before: int, fault: str, since: float, timeout: float) -> Recovery:
    try:
        wait_until(lambda: progress() > before, timeout, f"progress after {fault}")
    except TimeoutError:
        return Recovery(fault, False, time.monotonic() - since, exited(net))
    return Recovery(fault, True, time.monotonic() - since)


def _kill_restart(net: Network, names: list[str], progress: Callable[[], int], fault: str, timeout: float) -> Recovery:
    before = progress()
    killed_at = time.monotonic()
    processes: list[Process] = [net.by_name(n) for n in names]
    for p in processes:
        p.kill()
    time.sleep(0.5)
    for p in processes:
        p.restart()
    return _until(net, progress, before, fault, killed_at, timeout)


def _working(net: Network, name: str) -> bool:
    """``name`` holds a live lease: generating, about to, or uploading. Read from the ledger rather
    than the heartbeat's activity, which samples every few seconds and misses generations shorter
    than that on a node held back by a full validation backlog."""
    address = "0x" + (net.workdir / "wallets" / f"{name}.json").read_text().split('"address": "')[1][:40].lower()
    now = datetime.now(UTC)
    leased = _get(net, "/v1/admin/tasks?status=leased&limit=200")
    return any(t["leased_to"].lower() == address and datetime.fromisoformat(t["lease_expires_at"]) > now for t in leased)


def _until_working(net: Network, name: str) -> None:
    try:
        wait_until(lambda: _working(net, name), 120, f"{name} working")
    except TimeoutError as e:
        raise TimeoutError(f"{e}; pending {pending(net)};{exited(net)}\n{name}'s log:\n{net.by_name(name).tail(15)}") from None


def node_mid_generation(net: Network, rng: random.Random) -> Recovery:
    _until_working(net, "node-0")
    time.sleep(rng.uniform(0, 1))
    return _kill_restart(net, ["node-0"], lambda: verdicts(net), "node mid-generation", 180)


def node_mid_upload(net: Network, _rng: random.Random) -> Recovery:
    # Uploads are short; kill just as a new submission lands so the next one is in flight.
    start = pending(net)
    wait_until(lambda: pending(net) != start, 120, "an upload")
    return _kill_restart(net, ["node-0"], lambda: verdicts(net), "node mid-upload", 180)


def relay_mid_broadcast(net: Network, _rng: random.Random) -> Recovery:
    step = published(net)
    wait_until(lambda: published(net) > step, 300, "a new policy step")
    return _kill_restart(net, ["relay"], lambda: verdicts(net), "relay mid-broadcast", 180)


def validator_mid_batch(net: Network, _rng: random.Random) -> Recovery:
    wait_until(lambda: claimed(net), 120, "a validator claim")
    return _kill_restart(net, [p.name for p in net.validators()], lambda: verdicts(net), "every validator mid-batch", 180)


def trainer_mid_step(net: Network, rng: random.Random) -> Recovery:
    step = published(net)
    wait_until(lambda: published(net) > step, 300, "a new policy step")
    time.sleep(rng.uniform(0.2, 2.0))
    return _kill_restart(net, ["trainer"], lambda: published(net), "trainer mid-step", 300)


def trainer_mid_publish(net: Network, _rng: random.Random) -> Recovery:
    origin = net.workdir / "origin" / net.run_id
    step = published(net)
    wait_until(lambda: (origin / str(step + 1)).exists(), 300, "the trainer writing its next step")
    return _kill_restart(net, ["trainer"], lambda: published(net), "trainer mid-publish", 300)


def blob_store_outage(net: Network, _rng: random.Random, outage_s: float = 8.0) -> Recovery:
    """The coordinator's blob directory replaced by a file for ``outage_s`` (a lost mount: no
    write or read succeeds); recovery counts from the store's return until new uploads land and
    get verdicts again."""
    blobs = net.workdir / "blobs"
    away = blobs.with_name("blobs-away")
    _until_working(net, "node-0")
    blobs.rename(away)
    try:
        blobs.write_bytes(b"")
        time.sleep(outage_s)
    finally:
        blobs.unlink(missing_ok=True)
        away.rename(blobs)
    restored = time.monotonic()
    uploads, checked = submitted(net), verdicts(net)
    uploaded = _until(net, lambda: submitted(net), uploads, "blob store unavailable", restored, 180)
    if not uploaded.recovered:
        return uploaded
    return _until(net, lambda: verdicts(net), checked, f"blob store unavailable for {outage_s:.0f} s", restored, 180)


def _holding(net: Network, name: str, step: int) -> bool:
    return f"Holding policy step {step} " in net.by_name(name).log_path.read_text(errors="replace")


def slow_relay(net: Network, _rng: random.Random, stalled: float = 0.9, period: float = 1.0) -> Recovery:
    """The relay frozen (SIGSTOP) for ``stalled`` of every ``period`` seconds, so it answers at a
    tenth of its speed, until the node holds the next policy step; recovery counts from that
    step's publication."""
    relay = net.by_name("relay")
    done = threading.Event()

    def throttle() -> None:
        while not done.is_set():
            os.kill(relay.popen.pid, signal.SIGSTOP)
            done.wait(stalled)
            os.kill(relay.popen.pid, signal.SIGCONT)
            done.wait(period - stalled)

    throttler = threading.Thread(target=throttle, daemon=True)
    throttler.start()
    try:
        step = published(net)
        wait_until(lambda: published(net) > step, 300, "a new policy step")
        since, step = time.monotonic(), published(net)
        try:
            wait_until(lambda: _holding(net, "node-0", step), 180, f"node-0 holding step {step}")
        except TimeoutError:
            return Recovery("relay answering at a tenth of its speed", False, time.monotonic() - since, exited(net))
        return Recovery("relay answering at a tenth of its speed", True, time.monotonic() - since)
    finally:
        done.set()
        throttler.join()
        os.kill(relay.popen.pid, signal.SIGCONT)


CLOCK_SHIFT = """\
import os, time
_time, _path = time.time, os.environ["INTELLECT_CLOCK_SHIFT_FILE"]
def _shifted():
    try:
        with open(_path) as f:
            return _time() + float(f.read() or 0)
    except (OSError, ValueError):
        return _time()
time.time = _shifted
"""
"""A ``sitecustomize`` that shifts ``time.time()`` by the seconds written in a file, read on every call,
so a running process's clock can be moved from outside."""


def clock_skew(net: Network, _rng: random.Random) -> Recovery:
    """node-0's clock jumps past the signature window while it works: it must stop with exit code 2
    and a clear message, having recorded nothing with the bad clock; its held tasks return to the
    queue. Once the clock is right again it restarts; recovery counts from that restart until its
    next upload lands."""
    node = net.by_name("node-0")
    shim = net.workdir / "clock-shift"
    shim.mkdir(exist_ok=True)
    (shim / "sitecustomize.py").write_text(CLOCK_SHIFT)
    offset = shim / "offset-s"
    offset.write_text("0")
    path = os.pathsep.join(p for p in (str(shim), os.environ.get("PYTHONPATH", "")) if p)
    node.stop()
    node.env = {**node.env, "PYTHONPATH": path, "INTELLECT_CLOCK_SHIFT_FILE": str(offset)}
    node.restart()
    _until_working(net, "node-0")
    window = net.http.get(f"{net.coordinator.url}/v1/public/status", timeout=10).json()["signature_window_s"]
    offset.write_text(str(2 * window))
    try:
        node.popen.wait(120)
    except subprocess.TimeoutExpired:
        return Recovery("node clock off by twice the window", False, 120.0, exited(net))
    log = node.tail(5)
    if node.popen.returncode != 2 or "clock is" not in log:
        raise AssertionError(f"node-0 exited with {node.popen.returncode}, expected 2 and a clock message:\n{log}")
    offset.write_text("0")
    before = submitted(net)
    node.restart()
    return _until(net, lambda: submitted(net), before, "node clock off by twice the window", time.monotonic(), 180)


def coordinator_restart(net: Network, rng: random.Random) -> Recovery:
    time.sleep(rng.uniform(0, 2))
    return _kill_restart(net, ["coordinator"], lambda: verdicts(net), "coordinator killed, restarted on its database", 180)


def everything_at_once(net: Network, _rng: random.Random) -> Recovery:
    _until_working(net, "node-0")
    names = ["node-0", *(p.name for p in net.validators()), "trainer", "relay"]
    return _kill_restart(net, names, lambda: published(net), "node, validators, trainer and relay at once", 300)


FAULTS: dict[str, Callable[[Network, random.Random], Recovery]] = {
    "node-generation": node_mid_generation,
    "node-upload": node_mid_upload,
    "relay-broadcast": relay_mid_broadcast,
    "validator-batch": validator_mid_batch,
    "trainer-step": trainer_mid_step,
    "trainer-publish": trainer_mid_publish,
    "coordinator": coordinator_restart,
    "all-at-once": everything_at_once,
    "blob-store": blob_store_outage,
    "slow-relay": slow_relay,
    "clock-skew": clock_skew,
}


def drain(net: Network, stall_s: float = 120) -> int:
    """Stop the nodes, then let the validators finish every pending submission; returns the backlog it started with.

    A long backlog on a slow machine is fine as long as verdicts keep coming: this fails only after
    ``stall_s`` seconds without one, naming the backlog and showing the validator's log.
    """
    for p in net.processes:
        if p.name.startswith("node-"):
            p.stop()
    backlog = last = pending(net)
    progress_at = time.monotonic()
    while last > 0:
        time.sleep(0.5)
        now = pending(net)
        if now < last:
            last, progress_at = now, time.monotonic()
        elif time.monotonic() - progress_at > stall_s:
            logs = "".join(f"\n{p.name} log:\n{p.tail()}" for p in net.validators())
            raise TimeoutError(
                f"{now} of {backlog} submissions still pending, no verdict for {stall_s:.0f} s;{logs}{exited(net)}"
            )
    return backlog


def audit(net: Network) -> Audit:
    """Read the ledger and the trainer's checkpoint (after the network stopped)."""
    import torch

    from intellect_protocol.coordinator.models import ContributionEntry, Submission
    from intellect_protocol.trainer.loop import CHECKPOINT

    state = torch.load(net.workdir / "trainer" / CHECKPOINT, weights_only=False)["state"]
    ranges: list[tuple[int, int, int]] = sorted(state["consumed"], key=lambda r: r[1])
    engine = create_engine(net.database_url)
    with engine.connect() as connection:
        credits = [c for (c,) in connection.execute(select(ContributionEntry.id).where(ContributionEntry.kind == "credit"))]
        per_submission = connection.execute(
            select(ContributionEntry.submission_id, func.count())
            .where(ContributionEntry.kind == "credit")
            .group_by(ContributionEntry.submission_id)
        ).all()
        statuses = dict(connection.execute(select(Submission.id, Submission.status)).all())
        entries = connection.execute(
            select(ContributionEntry.submission_id, ContributionEntry.kind, ContributionEntry.units)
        ).all()
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
    net_units: dict[str, int] = {}
    for submission_id, kind, units in entries:
        net_units[submission_id] = net_units.get(submission_id, 0) + units
        if kind == "credit" and statuses.get(submission_id) not in ("accepted", "invalidated"):
            errors.append(f"credit for {submission_id}, which is {statuses.get(submission_id)}")
    errors += [f"clawback beyond credit on {s}" for s, u in net_units.items() if u < 0]
    unfinished = sum(1 for s in statuses.values() if s == "pending")
    # The trainer's own record, whatever killed it: one range per step, each starting where the last ended
    # and holding accepted work of its own, the last ending at the cursor, which names a real entry.
    by_step = sorted(state["consumed"])
    if [step for step, _, _ in by_step] != list(range(1, len(by_step) + 1)):
        errors.append(f"steps trained are not 1..{len(by_step)} once each: {[s for s, _, _ in by_step]}")
    if by_step and (by_step[0][1] != 0 or any(a[2] != b[1] for a, b in zip(by_step, by_step[1:]))):
        errors.append(f"consumed ranges skip or reread entries: {by_step}")
    if by_step and not (state["cursor"] == by_step[-1][2] <= max(credits, default=0)):
        errors.append(f"cursor {state['cursor']} is not the last range's end or names no ledger entry")
    errors += [f"step {s} trained on no accepted work ({a}, {b}]" for s, a, b in by_step if not any(a < c <= b for c in credits)]
    return Audit(state["step"], lost, duplicates, unfinished, errors)
