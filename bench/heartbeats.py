"""Signed heartbeats against a real coordinator (SQLite) over loopback, with a baseline.

N simulated nodes with real keys register, then send signed heartbeats. Measured in one run:
  1. sustained throughput: as fast as C connections allow, for signed heartbeats and for an
     unsigned no-op endpoint (GET /v1/public/time) through the same server;
  2. latency at a fixed offered load (open loop, default 500/s), for both.
  3. with ``--uploads U``: latency at the same offered load while U clients each upload 64 MiB
     signed bodies back to back (the largest a node may send), for the code of ``--before REV``
     (run from a git worktree) and for this tree, one after the other; the p99 ratio prints last.
  4. with ``--readers R``: latency at the same offered load alone, then while R clients (each from its own
     loopback address, under the coordinator's default per-client limits) read the public
     aggregates back to back (a run's throughput by the minute over a day, as round four's attack did, and
     over 12 hours, the leaderboard, the validators), each 20 requests/s (what the aggregates' own
     allowance refuses is answered 429); ``--rounds`` alternating pairs of phases, the round of median ratio
     reported; for ``--before REV`` too when given. Goal: p99 under the flood at most 1.5x the p99 without
     it; the ratio prints last.
Requests are signed before the clock starts: real nodes sign on their own machines, and
here the load generator shares the server's two cores.

    python bench/heartbeats.py --nodes 1000 --seconds 10 --rate 500
    python bench/heartbeats.py --nodes 200 --seconds 10 --rate 200 --uploads 4 --before REV
    python bench/heartbeats.py --nodes 200 --seconds 10 --rate 200 --readers 4 --before REV
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

import httpx
from eth_account import Account

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _http import build_request, closed_loop, open_loop  # noqa: E402
from _worktree import worktree  # noqa: E402

from intellect_protocol.devnet.processes import Process, migrate, start_coordinator  # noqa: E402
from intellect_protocol.shared.signing import (  # noqa: E402
    HEADER_ADDRESS,
    HEADER_BODY_SHA256,
    HEADER_NONCE,
    HEADER_SIGNATURE,
    HEADER_TIMESTAMP,
    SignedAuth,
    canonical_request,
    sign_request,
    sign_text,
)
from intellect_protocol.shared.version import PROTOCOL_HEADER, PROTOCOL_VERSION, __version__  # noqa: E402

T = TypeVar("T")


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


@contextmanager
def coordinator_of(workdir: Path, source: Path | None, limited: bool = False) -> Iterator[Process]:
    """A coordinator on a fresh SQLite ledger, running the code under ``source`` (None: this tree); ``limited``:
    with the default request rates per address and per client IP (else lifted)."""
    env = {"PYTHONPATH": str(source)} if source is not None else {}
    workdir.mkdir(parents=True, exist_ok=True)
    url = f"sqlite:///{workdir / 'ledger.db'}"
    migrate(url, workdir / "logs" / "migrate.log")
    # The limiter is per address; lift it so the bench measures the server, not the policy.
    lifted = {} if limited else {"INTELLECT_RATE_LIMIT_PER_S": "1000000", "INTELLECT_RATE_LIMIT_BURST": "1000000"}
    coordinator = start_coordinator(
        workdir,
        url,
        env={
            **env,
            **lifted,
            # every simulated node registers from loopback: one client IP to the coordinator
            "INTELLECT_REGISTRATIONS_PER_IP_PER_HOUR": "1000000",
            "INTELLECT_NEWCOMER_UPLOADS_PER_S": "1000000",
            "INTELLECT_MAX_CONNECTIONS_PER_IP": "100000",
        },
    )
    try:
        yield coordinator
    finally:
        coordinator.stop()


def register(url: str, count: int) -> tuple[list, str]:
    audience = httpx.get(f"{url}/v1/public/status").json()["audience"]
    accounts = [Account.create() for _ in range(count)]
    print(f"registering {count} nodes ...", flush=True)
    with httpx.Client(base_url=url) as client:
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
    return accounts, audience


class Uploader(threading.Thread):
    """Sends signed 64 MiB uploads back to back on one keep-alive connection until ``stop``."""

    def __init__(self, host: str, port: int, heads: list[bytes], body: bytes, stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.address, self.heads, self.body, self.stop = (host, port), heads, body, stop
        self.done = 0

    def run(self) -> None:
        with socket.create_connection(self.address) as sock, sock.makefile("rb") as replies:
            for head in self.heads:
                if self.stop.is_set():
                    return
                sock.sendall(head)
                sock.sendall(self.body)
                length = 0
                while (line := replies.readline()) not in (b"\r\n", b""):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                replies.read(length)
                self.done += 1


def upload_heads(accounts: list, audience: str, host: str, body: bytes, count: int) -> list[bytes]:
    """Request heads for ``body`` uploaded to a task nobody leased: the server receives, hashes and
    checks the signature of every byte before it refuses it (404), as for any upload."""
    digest = hashlib.sha256(body).hexdigest()
    heads = []
    for i in range(count):
        account, nonce, timestamp = accounts[i % len(accounts)], secrets.token_hex(16), int(time.time())
        text = canonical_request("POST", "/v1/submissions", "task=none", digest, timestamp, nonce, audience)
        headers = {
            HEADER_ADDRESS: account.address,
            HEADER_TIMESTAMP: str(timestamp),
            HEADER_NONCE: nonce,
            HEADER_SIGNATURE: sign_text(account, text),
            HEADER_BODY_SHA256: digest,
            PROTOCOL_HEADER: str(PROTOCOL_VERSION),
        }
        lines = [
            "POST /v1/submissions?task=none HTTP/1.1",
            f"host: {host}",
            f"content-length: {len(body)}",
            "content-type: application/octet-stream",
        ]
        heads.append(("\r\n".join(lines + [f"{k}: {v}" for k, v in headers.items()]) + "\r\n\r\n").encode())
    return heads


def beside(
    load: list[threading.Thread], stop: threading.Event, label: str, beats: list[bytes], host: str, args: argparse.Namespace
) -> dict:
    """Heartbeat latency at ``--rate`` while ``load`` runs (started here, stopped through ``stop`` after)."""
    hostname, port = host.split(":")
    for thread in load:
        thread.start()
    time.sleep(1.0)  # the load is flowing
    try:
        return summarize(label, *asyncio.run(open_loop(hostname, int(port), beats, args.rate, args.connections)))
    finally:
        stop.set()
        for thread in load:
            thread.join(60)


def under_uploads(source: Path | None, workdir: Path, args: argparse.Namespace) -> dict:
    """Heartbeat latency at ``--rate`` while ``--uploads`` clients send 64 MiB uploads."""
    with coordinator_of(workdir, source) as coordinator:
        host = coordinator.url.removeprefix("http://")
        hostname, port = host.split(":")
        accounts, audience = register(coordinator.url, args.nodes)
        beats = heartbeat_requests(accounts, audience, host, int(args.seconds * args.rate))
        body = os.urandom(64 << 20)
        stop = threading.Event()
        uploaders = [
            Uploader(hostname, int(port), upload_heads(accounts, audience, host, body, 200), body, stop)
            for _ in range(args.uploads)
        ]
        row = beside(uploaders, stop, f"signed heartbeat, {args.uploads} uploading", beats, host, args)
        row["uploads"] = sum(u.done for u in uploaders)
        print(f"{'':<34} {row['uploads']} uploads of 64 MiB answered meanwhile")
        return row


READER_RATE = 20.0
"""Requests per second one reader sends: the coordinator's default allowance per client IP, used to the full.
The aggregates have a tighter allowance of their own (2/s by default): what a reader sends past it is
answered 429, and counted apart."""


class Reader(threading.Thread):
    """Reads ``urls`` round-robin on one keep-alive connection from its own loopback address (a client of
    its own to the coordinator's per-IP limits), :data:`READER_RATE` a second, until ``stop``."""

    def __init__(self, base_url: str, urls: list[str], source_ip: str, stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.base_url, self.urls, self.source_ip, self.stop = base_url, urls, source_ip, stop
        self.done = self.bytes = self.refused = 0

    def run(self) -> None:
        transport = httpx.HTTPTransport(local_address=self.source_ip)
        started = time.monotonic()
        with httpx.Client(base_url=self.base_url, timeout=60, transport=transport) as client:
            while not self.stop.wait(max(0.0, started + self.done / READER_RATE - time.monotonic())):
                reply = client.get(self.urls[self.done % len(self.urls)])
                self.done += 1
                self.bytes += len(reply.content)
                self.refused += reply.status_code == 429


def under_readers(source: Path | None, workdir: Path, args: argparse.Namespace) -> tuple[dict, dict]:
    """Heartbeat latency at ``--rate`` alone, then while ``--readers`` clients flood the public aggregates, in
    ``--rounds`` alternating pairs of phases (a p99 over seconds moves with whatever else the machine did): the
    round of median ratio."""
    with coordinator_of(workdir, source, limited=True) as coordinator:
        host = coordinator.url.removeprefix("http://")
        hostname, port = host.split(":")
        env = {**os.environ, **({"PYTHONPATH": str(source)} if source is not None else {})}
        create = ["intellect-coordinator", "run", "create", "--name", "flood", "--environment", "arithmetic"]
        subprocess.run(
            [*create, "--database-url", f"sqlite:///{workdir / 'ledger.db'}"], check=True, capture_output=True, env=env
        )
        run_id = httpx.get(f"{coordinator.url}/v1/public/runs").json()[0]["id"]
        accounts, audience = register(coordinator.url, args.nodes)
        count, warm = int(args.seconds * args.rate), int(2 * args.rate)
        beats = heartbeat_requests(accounts, audience, host, 2 * args.rounds * count + warm)
        asyncio.run(open_loop(hostname, int(port), beats[-warm:], args.rate, args.connections))  # warm-up, not measured
        # The round-four attack asked for a day by the minute (1,440 buckets, refused now); 12 hours is the most allowed.
        throughput = f"/v1/public/runs/{run_id}/throughput"
        urls = [f"{throughput}?minutes=1440&bucket_s=60", f"{throughput}?minutes=720&bucket_s=60"]
        urls += ["/v1/public/leaderboard?limit=5000", "/v1/public/validators"]
        pairs = []
        for k in range(args.rounds):
            mine = beats[2 * k * count : 2 * (k + 1) * count]
            alone = summarize(
                "signed heartbeat, alone", *asyncio.run(open_loop(hostname, int(port), mine[:count], args.rate, args.connections))
            )
            stop = threading.Event()
            readers = [Reader(coordinator.url, urls, f"127.0.0.{2 + i}", stop) for i in range(args.readers)]
            flooded = beside(readers, stop, f"signed heartbeat, {args.readers} reading", mine[count:], host, args)
            reads, megabytes = sum(r.done for r in readers), sum(r.bytes for r in readers) / 1e6
            refused = sum(r.refused for r in readers)
            print(f"{'':<34} {reads} public reads meanwhile ({refused} of them 429; {megabytes:.1f} MB), at the default limits")
            pairs.append((alone, flooded))
        pairs.sort(key=lambda pair: pair[1]["p99_ms"] / pair[0]["p99_ms"])
        return pairs[len(pairs) // 2]


def before_and_after(measure: Callable[[Path | None, Path, argparse.Namespace], T], args: argparse.Namespace) -> dict[str, T]:
    """``measure`` on the code of ``--before`` (when given) and then on this tree, each on a fresh workdir."""
    with tempfile.TemporaryDirectory() as tmp:
        measured = {}
        if args.before:
            with worktree(args.before, Path(tmp) / "before-src") as tree:
                print(f"before ({args.before}):")
                measured["before"] = measure(tree, Path(tmp) / "before", args)
        print("this tree:")
        measured["after"] = measure(None, Path(tmp) / "after", args)
    return measured


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1000, help="simulated nodes, each with its own key")
    parser.add_argument("--seconds", type=float, default=8.0, help="length of each measured phase")
    parser.add_argument("--rate", type=float, default=500.0, help="offered load for the latency phase, requests/s")
    parser.add_argument("--connections", type=int, default=32, help="keep-alive connections of the load generator")
    parser.add_argument(
        "--uploads", type=int, default=0, help="measure heartbeats under this many concurrent 64 MiB uploaders instead"
    )
    parser.add_argument("--readers", type=int, default=0, help="measure heartbeats under this many public-read flooders instead")
    parser.add_argument("--before", help="with --uploads or --readers: a git revision measured first, as the baseline")
    parser.add_argument("--rounds", type=int, default=5, help="with --readers: alternating pairs of phases, the median reported")
    args = parser.parse_args()

    if args.readers:
        measured = before_and_after(under_readers, args)
        for label, (alone, flooded) in measured.items():
            print(
                f"{label}: heartbeat p99 {alone['p99_ms']:.1f} ms alone, {flooded['p99_ms']:.1f} ms under {args.readers} readers "
                f"(the round of median ratio, of {args.rounds})"
            )
        alone, flooded = measured["after"]
        print(
            f"goal: p99 under the flood at most 1.5x without it; ratio flooded/alone p99: {flooded['p99_ms'] / alone['p99_ms']:.2f}"
        )
        return

    if args.uploads:
        rows = before_and_after(under_uploads, args)
        if "before" in rows:
            b, a = rows["before"], rows["after"]
            print(f"\nheartbeat p99 under {args.uploads} uploaders: before {b['p99_ms']:.1f} ms, after {a['p99_ms']:.1f} ms")
            print(f"ratio p99 before/after: {b['p99_ms'] / a['p99_ms']:.2f}")
        return

    with tempfile.TemporaryDirectory() as tmp, coordinator_of(Path(tmp), None) as coordinator:
        host = coordinator.url.removeprefix("http://")
        hostname, port = host.split(":")
        accounts, audience = register(coordinator.url, args.nodes)
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
            summarize("signed heartbeat", *asyncio.run(closed_loop(hostname, int(port), signed[:sustained_n], args.connections)))
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

    print("\ntargets: >= 1000 signed heartbeats/s sustained, p99 < 50 ms at 500/s offered")
    print(f"signed heartbeats/s sustained: {rows[1]['per_s']:.0f}; p99 at {args.rate:.0f}/s: {rows[3]['p99_ms']:.1f} ms")
    print(f"ratio signed/no-op throughput: {rows[1]['per_s'] / rows[0]['per_s']:.2f}")


if __name__ == "__main__":
    main()
