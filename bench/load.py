"""Load: 1,000 simulated nodes (real keys, real signatures) against one coordinator process, on
SQLite and on PostgreSQL, then two coordinator processes on one PostgreSQL behind a round-robin.

Per configuration: a sweep of offered heartbeat rates (open loop: latency counts from the
scheduled send, so a server that falls behind is charged for its queue) with throughput, p50/p99,
errors and the coordinator processes' CPU use (cores busy: the binding resource when it nears
1 per process); then submissions (lease + signed upload of a small rollout file per task, closed
loop). With two coordinators, every node then goes silent and the status loops of both replicas
run: no node may enter the same status twice in a row (work claimed with SKIP LOCKED, never twice).

    python bench/load.py [--nodes 1000] [--seconds 6] [--rates 250,500,1000,2000]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

import httpx
from eth_account import Account
from sqlalchemy import create_engine, text

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _http import open_loop  # noqa: E402
from heartbeats import heartbeat_requests  # noqa: E402

from intellect_protocol.devnet.postgres import create_database, postgres_server  # noqa: E402
from intellect_protocol.devnet.processes import Process, admin_token, migrate, start_coordinator  # noqa: E402
from intellect_protocol.shared.rollout_file import Rollout, write_rollouts  # noqa: E402
from intellect_protocol.shared.schemas import sequence_seed  # noqa: E402
from intellect_protocol.shared.signing import SignedAuth, sign_request  # noqa: E402
from intellect_protocol.shared.version import __version__  # noqa: E402

ENV = {
    "INTELLECT_RATE_LIMIT_PER_S": "1000000",
    "INTELLECT_NEWCOMER_UPLOADS_PER_S": "1000000",
    "INTELLECT_RATE_LIMIT_BURST": "1000000",
    "INTELLECT_MAX_REQUESTS_PER_IP": "100000",
    "INTELLECT_HEARTBEAT_INTERVAL_S": "2",
    "INTELLECT_STATUS_LOOP_INTERVAL_S": "0.5",
    "INTELLECT_MAX_VALIDATION_BACKLOG": "1000000",
    "INTELLECT_BACKLOG_FLOOR": "1000000",
    # Every simulated node connects from loopback: per-IP bounds would count them as one client.
    "INTELLECT_MAX_CONNECTIONS_PER_IP": "100000",
    "INTELLECT_REGISTRATIONS_PER_IP_PER_HOUR": "1000000",
}


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100  # utime + stime, in clock ticks of 1/100 s


def register(url: str, accounts: list, audience: str) -> None:
    async def go() -> None:
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            gate = asyncio.Semaphore(16)

            async def one(account) -> None:
                async with gate:
                    body = {
                        "address": account.address,
                        "client_version": __version__,
                        "specs": {"cpu_cores": 2, "ram_bytes": 1 << 34, "disk_free_bytes": 1 << 36},
                    }
                    (await client.post("/v1/nodes/register", json=body, auth=SignedAuth(account, audience))).raise_for_status()

            await asyncio.gather(*(one(a) for a in accounts))

    asyncio.run(go())


def rollout_file(task: dict) -> bytes:
    rows, index = [], 0
    for prompt_id in task["prompt_ids"]:
        for _ in range(task["samples_per_prompt"]):
            rows.append(
                Rollout(
                    task_id=task["task_id"],
                    run_id=task["run_id"],
                    policy_step=task["policy_step"],
                    prompt_id=prompt_id,
                    prompt_tokens=[1, 4, 5],
                    completion_tokens=[6, 7, 2],
                    logprobs=[-0.5] * 3,
                    finish_reason="stop",
                    reward=1.0,
                    task_reward=1.0,
                    length_penalty=0.0,
                    target_length=0,
                    seed=sequence_seed(task["seed"], index),
                    proofs=b"",
                )
            )
            index += 1
    return write_rollouts(rows)


def submissions(urls: list[str], accounts: list, audience: str, concurrency: int = 32) -> dict:
    """Each node leases a task and uploads its file; returns submissions/s, upload p50/p99, errors."""
    latencies: list[float] = []
    errors = 0

    async def go() -> float:
        nonlocal errors
        clients = [httpx.AsyncClient(base_url=u, timeout=60) for u in urls]
        gate = asyncio.Semaphore(concurrency)

        async def one(i: int, account) -> None:
            nonlocal errors
            client = clients[i % len(clients)]
            async with gate:
                lease = await client.post(
                    "/v1/tasks/lease", json={"address": account.address}, auth=SignedAuth(account, audience)
                )
                if lease.status_code != 200:
                    errors += 1
                    return
                task = lease.json()
                data = rollout_file(task)
                query = f"task={task['task_id']}"
                headers = {
                    "content-type": "application/octet-stream",
                    **sign_request(account, "POST", "/v1/submissions", query, data, audience),
                }
                started = time.perf_counter()
                reply = await client.post(f"/v1/submissions?{query}", content=data, headers=headers)
                latencies.append(time.perf_counter() - started)
                errors += reply.status_code != 200

        started = time.perf_counter()
        await asyncio.gather(*(one(i, a) for i, a in enumerate(accounts)))
        for c in clients:
            await c.aclose()
        return time.perf_counter() - started

    elapsed = asyncio.run(go())
    ordered = sorted(latencies)
    return {
        "per_s": (len(accounts) - errors) / elapsed,
        "p50_ms": 1000 * ordered[len(ordered) // 2],
        "p99_ms": 1000 * ordered[int(len(ordered) * 0.99) - 1],
        "errors": errors,
    }


def sweep(
    label: str, coordinators: list[Process], accounts: list, audience: str, rates: list[float], seconds: float
) -> list[dict]:
    host = coordinators[0].url.removeprefix("http://")
    hostname = host.split(":")[0]
    ports = [int(c.url.rsplit(":", 1)[1]) for c in coordinators]
    rows = []
    for rate in rates:
        requests = heartbeat_requests(accounts, audience, host, int(rate * seconds))
        cpu_before = [cpu_seconds(c.popen.pid) for c in coordinators]
        elapsed, latencies, statuses = asyncio.run(open_loop(hostname, ports, requests, rate, 64))
        cores = [(cpu_seconds(c.popen.pid) - b) / elapsed for c, b in zip(coordinators, cpu_before)]
        ordered = sorted(latencies)
        ok = sum(n for s, n in statuses.items() if 200 <= s < 300)
        row = {
            "config": label,
            "offered": rate,
            "per_s": ok / elapsed,
            "p50_ms": 1000 * ordered[len(ordered) // 2],
            "p99_ms": 1000 * ordered[int(len(ordered) * 0.99) - 1],
            "errors": len(latencies) - ok,
            "cores": cores,
        }
        print(
            f"  {label:<22} offered {rate:6.0f}/s  served {row['per_s']:6.0f}/s  p50 {row['p50_ms']:7.1f} ms  p99 {row['p99_ms']:7.1f} ms"
            f"  errors {row['errors']:4d}  coordinator cores {'+'.join(f'{c:.2f}' for c in cores)}",
            flush=True,
        )
        rows.append(row)
    return rows


def saturation(rows: list[dict]) -> str:
    for row in rows:
        if row["per_s"] < 0.95 * row["offered"] or row["p99_ms"] > 250 or row["errors"]:
            return f"saturates by {row['offered']:.0f}/s offered ({row['per_s']:.0f}/s served, p99 {row['p99_ms']:.0f} ms)"
    return f"not saturated at {rows[-1]['offered']:.0f}/s offered"


def run_config(label: str, urls: list[str], workdir: Path, accounts: list, args: argparse.Namespace, replicas: int) -> dict:
    coordinators = [start_coordinator(workdir / f"c{i}", urls[0], env=ENV) for i in range(replicas)]
    try:
        base = coordinators[0].url
        audience = httpx.get(f"{base}/v1/public/status").json()["audience"]
        token = (workdir / "token").read_text().strip()
        run = {"name": f"load-{label}", "prompts_per_task": 1, "samples_per_prompt": 2, "sampling": {"max_tokens": 8}}
        httpx.post(f"{base}/v1/admin/runs", json=run, headers={"authorization": f"Bearer {token}"}).raise_for_status()
        print(f"{label}: registering {len(accounts)} nodes ...", flush=True)
        register(base, accounts, audience)
        rows = sweep(label, coordinators, accounts, audience, args.rates, args.seconds)
        subs = submissions([c.url for c in coordinators], accounts, audience)
        print(
            f"  {label:<22} submissions {subs['per_s']:6.0f}/s  upload p50 {subs['p50_ms']:.1f} ms  p99 {subs['p99_ms']:.1f} ms  errors {subs['errors']}",
            flush=True,
        )
        twice = None
        if replicas > 1:
            time.sleep(8)  # silence: every node passes 'unhealthy after missed heartbeats' while both status loops run
            engine = create_engine(urls[0])
            with engine.connect() as connection:
                events = connection.execute(text("SELECT address, to_status FROM node_status_events ORDER BY address, id")).all()
            engine.dispose()
            # Nodes flap healthy <-> unhealthy legitimately under load; a transition made twice (two
            # replicas evaluating one node) shows as the same status entered twice in a row.
            twice = sum(1 for a, b in zip(events, events[1:]) if a == b)
            unhealthy = len({address for address, status in events if status == "unhealthy"})
            print(f"  {label:<22} nodes turned unhealthy: {unhealthy}; transitions recorded twice in a row: {twice}", flush=True)
        return {"rows": rows, "submissions": subs, "twice": twice}
    finally:
        for c in coordinators:
            c.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=6.0, help="length of each offered-rate step")
    parser.add_argument("--rates", default="250,500,1000,2000", help="offered heartbeat rates, per second")
    args = parser.parse_args()
    args.rates = [float(r) for r in args.rates.split(",")]
    print(f"creating {args.nodes} keys ...", flush=True)
    accounts = [Account.create() for _ in range(args.nodes)]
    results = {}
    # The server runs as the postgres user: its directory must not sit inside a root-only one.
    with tempfile.TemporaryDirectory() as tmp, postgres_server(Path(tempfile.mkdtemp(prefix="intellect-pg-"))) as server:
        for label, replicas in (("sqlite, 1 coordinator", 1), ("postgres, 1 coordinator", 1), ("postgres, 2 coordinators", 2)):
            workdir = Path(tmp) / label.replace(" ", "").replace(",", "-")
            workdir.mkdir()
            url = (
                f"sqlite:///{workdir / 'ledger.db'}"
                if label.startswith("sqlite")
                else create_database(server, f"load{len(results)}")
            )
            migrate(url, workdir / "logs" / "migrate.log")
            (workdir / "token").write_text(admin_token(url))
            results[label] = run_config(label, [url], workdir, accounts, args, replicas)

    print()
    for label, result in results.items():
        best = max(r["per_s"] for r in result["rows"])
        print(
            f"{label:<26} best {best:6.0f} heartbeats/s; {saturation(result['rows'])}; submissions {result['submissions']['per_s']:.0f}/s"
        )
    one, two = results["postgres, 1 coordinator"], results["postgres, 2 coordinators"]
    print(f"background work done twice with 2 replicas: {two['twice']} transitions (must be 0)")
    ratio = max(r["per_s"] for r in two["rows"]) / max(r["per_s"] for r in one["rows"])
    print(f"throughput ratio two coordinators / one (PostgreSQL, heartbeats): {ratio:.2f}")


if __name__ == "__main__":
    main()
