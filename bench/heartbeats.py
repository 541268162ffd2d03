"""Signed heartbeats against a real coordinator (SQLite) over loopback, with a baseline.

N simulated nodes with real keys register, then send signed heartbeats. Measured in one run:
  1. sustained throughput: as fast as C connections allow, for signed heartbeats and for an
     unsigned no-op endpoint (GET /v1/public/time) through the same server;
  2. latency at a fixed offered load (open loop, default 500/s), for both.
Requests are signed before the clock starts: real nodes sign on their own machines, and
here the load generator shares the server's two cores.

    python bench/heartbeats.py --nodes 1000 --seconds 10 --rate 500
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from pathlib import Path

import httpx
from eth_account import Account

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _http import build_request, closed_loop, open_loop  # noqa: E402

from devnet.processes import migrate, start_coordinator  # noqa: E402
from shared.signing import SignedAuth, sign_request  # noqa: E402
from shared.version import __version__  # noqa: E402


def heartbeat_requests(accounts: list, audience: str, host: str, count: int) -> list[bytes]:
    out = []
    for i in range(count):
        account = accounts[i % len(accounts)]
        body = json.dumps(
            {
                "address": account.address,
                "client_version": __version__,
                "activity": "generating",
                "metrics": {"tokens_per_s": 123.0},
            }
        ).encode()
        headers = sign_request(account, "POST", "/v1/nodes/heartbeat", "", body, audience)
        out.append(build_request("POST", "/v1/nodes/heartbeat", host, body, headers))
    return out


def summarize(label: str, elapsed: float, latencies: list[float], statuses: dict[int, int]) -> dict:
    ordered = sorted(latencies)
    ok = sum(n for s, n in statuses.items() if 200 <= s < 300)
    row = {
        "label": label,
        "requests": len(latencies),
        "ok": ok,
        "errors": len(latencies) - ok,
        "per_s": ok / elapsed,
        "p50_ms": 1000 * ordered[len(ordered) // 2],
        "p99_ms": 1000 * ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))],
    }
    print(
        f"{label:<34} {row['per_s']:8.0f}/s  p50 {row['p50_ms']:6.1f} ms  p99 {row['p99_ms']:6.1f} ms  errors {row['errors']} {dict(statuses)}"
    )
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1000, help="simulated nodes, each with its own key")
    parser.add_argument("--seconds", type=float, default=8.0, help="length of each measured phase")
    parser.add_argument("--rate", type=float, default=500.0, help="offered load for the latency phase, requests/s")
    parser.add_argument("--connections", type=int, default=32, help="keep-alive connections of the load generator")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        url = f"sqlite:///{workdir / 'ledger.db'}"
        migrate(url, workdir / "logs" / "migrate.log")
        # The limiter is per address; lift it so the bench measures the server, not the policy.
        coordinator = start_coordinator(
            workdir, url, env={"INTELLECT_RATE_LIMIT_PER_S": "1000000", "INTELLECT_RATE_LIMIT_BURST": "1000000",
                               # every simulated node registers from loopback: one client IP to the coordinator
                               "INTELLECT_REGISTRATIONS_PER_IP_PER_HOUR": "1000000", "INTELLECT_MAX_CONNECTIONS_PER_IP": "100000"}
        )
        try:
            host = coordinator.url.removeprefix("http://")
            hostname, port = host.split(":")
            audience = httpx.get(f"{coordinator.url}/v1/public/status").json()["audience"]
            accounts = [Account.create() for _ in range(args.nodes)]
            print(f"registering {args.nodes} nodes ...", flush=True)
            with httpx.Client(base_url=coordinator.url) as client:
                for account in accounts:
                    client.post(
                        "/v1/nodes/register",
                        json={
                            "address": account.address,
                            "specs": {"cpu_cores": 2, "ram_bytes": 1 << 34, "disk_free_bytes": 1 << 36},
                            "client_version": __version__,
                        },
                        auth=SignedAuth(account, audience),
                    ).raise_for_status()

            sustained_n = int(args.seconds * 2000)
            latency_n = int(args.seconds * args.rate)
            print(f"signing {sustained_n + latency_n} heartbeats ...", flush=True)
            signed = heartbeat_requests(accounts, audience, host, sustained_n + latency_n)
            noop = [build_request("GET", "/v1/public/time", host)] * max(sustained_n, latency_n)

            rows = []
            print(f"\nphase 1: sustained, {args.connections} connections")
            rows.append(
                summarize(
                    "no-op (unsigned, no database)",
                    *asyncio.run(closed_loop(hostname, int(port), noop[:sustained_n], args.connections)),
                )
            )
            rows.append(
                summarize(
                    "signed heartbeat", *asyncio.run(closed_loop(hostname, int(port), signed[:sustained_n], args.connections))
                )
            )
            print(f"\nphase 2: open loop at {args.rate:.0f}/s offered")
            rows.append(
                summarize(
                    "no-op (unsigned, no database)",
                    *asyncio.run(open_loop(hostname, int(port), noop[:latency_n], args.rate, args.connections)),
                )
            )
            rows.append(
                summarize(
                    "signed heartbeat",
                    *asyncio.run(open_loop(hostname, int(port), signed[sustained_n:], args.rate, args.connections)),
                )
            )
        finally:
            coordinator.stop()

    print("\ntargets: >= 1000 signed heartbeats/s sustained, p99 < 50 ms at 500/s offered")
    print(f"signed heartbeats/s sustained: {rows[1]['per_s']:.0f}; p99 at {args.rate:.0f}/s: {rows[3]['p99_ms']:.1f} ms")
    print(f"ratio signed/no-op throughput: {rows[1]['per_s'] / rows[0]['per_s']:.2f}")


if __name__ == "__main__":
    main()
