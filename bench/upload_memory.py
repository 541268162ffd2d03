"""Memory under hostile uploads: one coordinator process, its resident memory sampled every 20 ms,
while many clients at once send (a) signed uploads that trickle in, (b) bodies declared larger
than the limit, (c) deeply nested JSON (which once crashed the process), (d) a rollout file of a
few KB declaring 150 M tokens for a real leased task (its baseline: what reading the same file
with plain pyarrow holds, measured in its own process), (e) 12 anonymous 64 MiB bodies for a node's
live lease, signed by fresh wallets (refused on their headers: the bytes staged meanwhile, and the
node's own upload's answer time during them), (f) large signed uploads for live leases at full speed;
a real node heartbeats from another address throughout. The large-upload flood runs twice: with the in-flight body budget
(``max_body_bytes_in_flight``) as configured, and with the budget lifted (the baseline). Prints
per phase: peak memory above idle, answers by status, and the node's heartbeat latency; the ratio
of the two floods' peaks last.

    python bench/upload_memory.py [--uploads 40] [--upload-mib 64] [--budget-mib 1024] [--slow 240]
"""

from __future__ import annotations

import argparse
import io
import multiprocessing
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from eth_account import Account

sys.path.insert(0, str(Path(__file__).parent))
from _watchers import Heartbeats, Sampler  # noqa: E402
from load import ENV, register  # noqa: E402

from intellect_protocol.devnet.processes import Process, admin_token, migrate, start_coordinator  # noqa: E402
from intellect_protocol.shared.rollout_file import SCHEMA  # noqa: E402
from intellect_protocol.shared.schemas import sequence_seed  # noqa: E402
from intellect_protocol.shared.signing import SignedAuth, sign_request  # noqa: E402


def in_parallel(one: Callable[[int], None], count: int) -> None:
    threads = [threading.Thread(target=one, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def leased_tasks(url: str, audience: str, count: int) -> list[tuple[Account, str]]:
    """``count`` live leases, three per fresh node (its most): (node, task id) each."""
    nodes = [Account.create() for _ in range(-(-count // 3))]
    register(url, nodes, audience)
    leases: list[tuple[Account, str]] = []
    for node in nodes:
        held: list[str] = []
        while len(held) < 3 and len(leases) < count:
            body = {"address": node.address, "working_on": held}
            reply = httpx.post(f"{url}/v1/tasks/lease", json=body, auth=SignedAuth(node, audience), timeout=60)
            reply.raise_for_status()
            held.append(reply.json()["task_id"])
            leases.append((node, held[-1]))
    return leases


def big_uploads(url: str, audience: str, count: int, size: int) -> Counter[int]:
    """``count`` validly signed uploads of ``size`` bytes for live leases (three per node), from 16
    addresses, each sent at full speed but its last byte, and all last bytes together: the worst
    case, every body in the coordinator's memory at once. Each passes the header checks and must be
    read whole to check its signature (then it is no rollout file: 422)."""
    data = bytes(size)
    leases = leased_tasks(url, audience, count)
    signed = [sign_request(node, "POST", "/v1/submissions", f"task={task}", data, audience) for node, task in leases]
    host, port = url.removeprefix("http://").split(":")
    statuses: Counter[int] = Counter()
    barrier = threading.Barrier(count)

    def one(i: int) -> None:
        head = "".join(f"{k}: {v}\r\n" for k, v in signed[i].items())
        with socket.create_connection((host, int(port)), source_address=(f"127.0.1.{i % 16 + 1}", 0), timeout=300) as conn:
            conn.sendall(
                f"POST /v1/submissions?task={leases[i][1]} HTTP/1.1\r\nhost: {host}\r\ncontent-length: {size}\r\n{head}\r\n".encode()
            )
            conn.settimeout(1.0)
            try:
                early = conn.recv(4096)  # refused on its headers alone (the budget)
            except TimeoutError:
                early = b""
            conn.settimeout(300)
            if not early:
                conn.sendall(memoryview(data)[:-1])
            barrier.wait()
            if not early:
                conn.sendall(data[-1:])
            statuses[int((early or conn.recv(4096)).split(b" ", 2)[1])] += 1

    in_parallel(one, count)
    return statuses


def slow_bodies(url: str, audience: str, count: int, declared: int, hold_s: float) -> Counter[int]:
    """``count`` connections that each declare a signed upload of ``declared`` bytes for one node's
    live lease (so the coordinator must read it to check the signature) and send one byte a second
    for ``hold_s``: the node's share admits three at once, the rest are refused (429)."""
    ((node, task),) = leased_tasks(url, audience, 1)
    signed = sign_request(node, "POST", "/v1/submissions", f"task={task}", bytes(declared), audience)
    head = "".join(f"{k}: {v}\r\n" for k, v in signed.items())
    host, port = url.removeprefix("http://").split(":")
    statuses: Counter[int] = Counter()

    def one(i: int) -> None:
        with socket.create_connection((host, int(port)), source_address=(f"127.0.2.{i % 200 + 1}", 0), timeout=60) as conn:
            conn.sendall(
                f"POST /v1/submissions?task={task} HTTP/1.1\r\nhost: {host}\r\ncontent-length: {declared}\r\n{head}\r\n".encode()
            )
            conn.settimeout(1.0)
            deadline, reply = time.monotonic() + hold_s, b""
            while time.monotonic() < deadline:
                try:
                    reply = conn.recv(4096)
                    break
                except TimeoutError:
                    conn.sendall(b"x")
            statuses[int(reply.split(b" ", 2)[1]) if reply else 0] += 1  # 0: still being received when we hung up

    in_parallel(one, count)
    return statuses


def anonymous_bodies(url: str, audience: str, count: int, size: int, staging: Path) -> Counter[int | str]:
    """``count`` bodies of ``size`` bytes sent at full speed for a node's live lease, each signed by a
    fresh wallet (no node): refused on their headers. Also the most bytes the coordinator's staging
    directory held meanwhile, and an honest upload's answer time for the same node during the flood."""
    ((node, task),) = leased_tasks(url, audience, 1)
    data = bytes(size)
    query = f"task={task}"
    heads = [
        "".join(
            f"{k}: {v}\r\n" for k, v in sign_request(Account.create(), "POST", "/v1/submissions", query, data, audience).items()
        )
        for _ in range(count)
    ]
    host, port = url.removeprefix("http://").split(":")
    statuses: Counter[int | str] = Counter()
    most, done = 0, threading.Event()

    def watch() -> None:
        nonlocal most
        while not done.is_set():
            most = max(most, sum(f.stat().st_size for f in staging.glob("*") if f.is_file()) if staging.exists() else 0)
            time.sleep(0.002)

    def one(i: int) -> None:
        with socket.create_connection((host, int(port)), source_address=(f"127.0.3.{i % 200 + 1}", 0), timeout=120) as conn:
            conn.sendall(
                f"POST /v1/submissions?{query} HTTP/1.1\r\nhost: {host}\r\ncontent-length: {size}\r\n{heads[i]}\r\n".encode()
            )
            try:
                conn.sendall(data)
            except OSError:
                pass  # refused and closed mid-body: what we want
            statuses[int(conn.recv(4096).split(b" ", 2)[1])] += 1

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    flood = threading.Thread(target=in_parallel, args=(one, count))
    flood.start()
    honest = bytes(1 << 20)  # not a rollout file (422), but read whole and judged: the honest path's cost
    started = time.monotonic()
    reply = httpx.post(
        f"{url}/v1/submissions?{query}",
        content=honest,
        headers=sign_request(node, "POST", "/v1/submissions", query, honest, audience),
        timeout=120,
    )
    statuses[f"honest {reply.status_code} in ms"] = round((time.monotonic() - started) * 1000)
    flood.join()
    done.set()
    watcher.join()
    statuses["staged_mib"] = most >> 20
    return statuses


def oversized(url: str, count: int) -> Counter[int]:
    """``count`` requests declaring a terabyte each, sending nothing after their headers."""
    host, port = url.removeprefix("http://").split(":")
    statuses: Counter[int] = Counter()
    for _ in range(count):
        with socket.create_connection((host, int(port)), timeout=30) as conn:
            conn.sendall(f"POST /v1/submissions?task=x HTTP/1.1\r\nhost: {host}\r\ncontent-length: {1 << 40}\r\n\r\n".encode())
            statuses[int(conn.recv(4096).split(b" ", 2)[1])] += 1
    return statuses


def deep_json(url: str, audience: str, rounds: int) -> Counter[int]:
    """Nested arrays, 120,000 deep to an admin endpoint and 200,000 deep to the heartbeat (unsigned and signed)."""
    node = Account.create()
    register(url, [node], audience)
    statuses: Counter[int] = Counter()
    for _ in range(rounds):
        for path, depth, signed in (
            ("/v1/admin/roles", 120_000, False),
            ("/v1/nodes/heartbeat", 200_000, False),
            ("/v1/nodes/heartbeat", 200_000, True),
        ):
            body = b"[" * depth + b"]" * depth
            headers = {
                "content-type": "application/json",
                **(sign_request(node, "POST", path, "", body, audience) if signed else {}),
            }
            statuses[httpx.post(url + path, content=body, headers=headers, timeout=60).status_code] += 1
    return statuses


def token_bomb(url: str, audience: str, tokens: int) -> Counter[int | str]:
    """A fresh node leases a task and uploads its rows with the first completion ``tokens`` zeros."""
    node = Account.create()
    register(url, [node], audience)
    task = httpx.post(f"{url}/v1/tasks/lease", json={"address": node.address}, auth=SignedAuth(node, audience), timeout=60).json()
    rows = [
        (pid, sequence_seed(task["seed"], i))
        for i, pid in enumerate(p for p in task["prompt_ids"] for _ in range(task["samples_per_prompt"]))
    ]
    columns = {
        "task_id": [task["task_id"]] * len(rows),
        "run_id": [task["run_id"]] * len(rows),
        "policy_step": [task["policy_step"]] * len(rows),
        "prompt_id": [pid for pid, _ in rows],
        "prompt_tokens": [[1, 2]] * len(rows),
        "logprobs": [[-0.5]] * len(rows),
        "finish_reason": ["length"] * len(rows),
        "reward": [0.0] * len(rows),
        "task_reward": [0.0] * len(rows),
        "length_penalty": [0.0] * len(rows),
        "target_length": [0] * len(rows),
        "seed": [seed for _, seed in rows],
        "proofs": [b""] * len(rows),
    }
    lengths = [tokens] + [1] * (len(rows) - 1)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    columns["completion_tokens"] = pa.ListArray.from_arrays(offsets, np.zeros(offsets[-1], np.int32))
    buffer = io.BytesIO()
    pq.write_table(pa.table(columns).select(SCHEMA.names).cast(SCHEMA), buffer, compression="zstd")
    bomb = buffer.getvalue()
    query = f"task={task['task_id']}"
    headers = {"content-type": "application/octet-stream", **sign_request(node, "POST", "/v1/submissions", query, bomb, audience)}
    started = time.monotonic()
    reply = httpx.post(f"{url}/v1/submissions?{query}", content=bomb, headers=headers, timeout=120)
    answer_ms = (time.monotonic() - started) * 1000
    plain = subprocess.run(  # the baseline: the same bytes read by pyarrow without our limits
        [
            sys.executable,
            "-c",
            "import io, resource, sys, pyarrow.parquet as pq; pq.read_table(io.BytesIO(sys.stdin.buffer.read())); "
            "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)",
        ],
        input=bomb,
        capture_output=True,
    )
    # Plain pyarrow may not survive the file at all (it aborts on the allocation): that is the baseline then.
    baseline = (
        {"plain_pyarrow_peak_mib": int(plain.stdout) // 1024}
        if plain.returncode == 0
        else {f"plain_pyarrow_died_exit_{plain.returncode}": 1}
    )
    return Counter({reply.status_code: 1, "file_kib": len(bomb) // 1024, "answer_ms": round(answer_ms), **baseline})


def coordinator(workdir: Path, budget: int) -> tuple[Process, str]:
    url = f"sqlite:///{workdir / 'ledger.db'}"
    migrate(url, workdir / "migrate.log")
    env = {**ENV, "INTELLECT_BLOB_DIR": str(workdir / "blobs"), "INTELLECT_MAX_BODY_BYTES_IN_FLIGHT": str(budget)}
    process = start_coordinator(workdir, url, env=env)
    audience = httpx.get(f"{process.url}/v1/public/status").json()["audience"]
    token = admin_token(url)
    run = {"name": "bench", "prompts_per_task": 4, "samples_per_prompt": 4, "sampling": {"max_tokens": 4096}}
    httpx.post(f"{process.url}/v1/admin/runs", json=run, headers={"authorization": f"Bearer {token}"}).raise_for_status()
    return process, audience


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--uploads", type=int, default=40, help="large uploads sent at once")
    parser.add_argument("--upload-mib", type=int, default=64, help="size of each (the default upload limit)")
    parser.add_argument("--budget-mib", type=int, default=1024, help="max_body_bytes_in_flight (the default)")
    parser.add_argument("--slow", type=int, default=240, help="trickling connections (from 200 addresses)")
    args = parser.parse_args()
    size, budget = args.upload_mib << 20, args.budget_mib << 20
    print(
        f"{args.uploads} uploads x {args.upload_mib} MiB = {args.uploads * args.upload_mib} MiB offered at once; budget {args.budget_mib} MiB"
    )
    peaks: dict[str, int] = {}
    for label, limit in (("budget", budget), ("no budget", 1 << 50)):
        workdir = Path(tempfile.mkdtemp(prefix="upload-memory-"))
        process, audience = coordinator(workdir, limit)
        try:
            idle = Sampler(process.popen.pid).rss()
            # Small attacks first: memory a process once took is not given back, so the flood of
            # large uploads comes last. Each attack runs in its own process, so its threads do not
            # starve the heartbeating node of this one's GIL.
            phases: list[tuple[str, Callable[..., Counter[int]], tuple]] = []
            if label == "budget":
                phases += [
                    ("trickling signed uploads", slow_bodies, (process.url, audience, args.slow, size, 8.0)),
                    ("declared 1 TiB", oversized, (process.url, 200)),
                    ("deeply nested JSON", deep_json, (process.url, audience, 10)),
                    ("150 M-token rollout file", token_bomb, (process.url, audience, 150_000_000)),
                    (
                        "anonymous 64 MiB bodies",
                        anonymous_bodies,
                        (process.url, audience, 12, size, workdir / "blobs" / ".incoming"),
                    ),
                ]
            phases.append(("large uploads", big_uploads, (process.url, audience, args.uploads, size)))
            for phase, attack, attack_args in phases:
                with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as attacker:
                    attacker.submit(time.sleep, 0).result()  # the attacker process is up before the clock starts
                    with Sampler(process.popen.pid) as sampled, Heartbeats(process.url, audience) as node:
                        started = time.monotonic()
                        statuses = attacker.submit(attack, *attack_args).result()
                        took = time.monotonic() - started
                alive = "alive" if process.popen.poll() is None else f"DEAD (exit {process.popen.returncode})"
                print(
                    f"[{label}] {phase}: peak {(sampled.peak - idle) / 2**20:.0f} MiB above idle ({idle / 2**20:.0f} MiB), "
                    f"answers {dict(statuses)}, {took:.1f} s; coordinator {alive}; node heartbeats {node.summary()}",
                    flush=True,
                )
                if phase == "large uploads":
                    peaks[label] = sampled.peak - idle
        finally:
            process.stop()
    print(
        f"peak memory above idle under the large-upload flood: {peaks['budget'] / 2**20:.0f} MiB with the budget, "
        f"{peaks['no budget'] / 2**20:.0f} MiB without"
    )
    print(f"ratio without/with budget: {peaks['no budget'] / max(peaks['budget'], 1):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
