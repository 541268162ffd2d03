"""Shardcast against the naive two-hop copy, in the same run, on loopback.

Ours: a coordinator, the origin (`intellect-relay --origin`), one relay and C client
processes (already started and waiting, like nodes that are running). Clock: from the
trainer hashing and signing the step it wrote (`publish_step`) and posting its manifest,
until every client holds the verified files.

Naive: `python -m http.server` (threaded) over the trainer's directory, `curl` copying every
file into a relay directory, a second `http.server` over that, C `curl`s in parallel into
client directories, then a blake3 check of every client's files against the source.

While our clients download, a probe asks the relay for `/v1/steps` and the coordinator for
the manifest every 50 ms: the metadata latency must stay under 50 ms.

    python bench/shardcast.py [--sizes 200,1024] [--clients 4] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import blake3
import httpx
from eth_account import Account

from intellect_protocol.devnet.processes import (
    Process,
    admin_token,
    create_run,
    free_port,
    migrate,
    spawn,
    start_coordinator,
    start_relay,
)
from intellect_protocol.shared.coordinator_client import CoordinatorClient
from intellect_protocol.shared.shardcast.origin import publish_step, step_dir
from intellect_protocol.shared.wallet import THROWAWAY_SCRYPT_N, create_wallet

PASSWORD = "bench"
CLIENT = """
import sys
from pathlib import Path
from intellect_protocol.shared.coordinator_client import CoordinatorClient
from intellect_protocol.shared.shardcast.client import download_step
coordinator, run_id, dest = sys.argv[1:4]
sys.stdin.readline()  # go
download_step(CoordinatorClient(coordinator), run_id, 1, Path(dest))
print("done", flush=True)
"""


def write_step(directory: Path, size: int) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps({"model_type": "llama"}))
    block = os.urandom(1 << 20)
    with (directory / "model.safetensors").open("wb") as f:
        for i in range(size >> 20):
            f.write(block[i % 251 :] + block[: i % 251])  # distinct chunks, cheap to make


def file_hashes(directory: Path) -> dict[str, str]:
    return {
        p.relative_to(directory).as_posix(): blake3.blake3(p.read_bytes(), max_threads=blake3.blake3.AUTO).hexdigest()
        for p in sorted(directory.rglob("*"))
        if p.is_file() and not p.name.startswith((".", "manifest"))
    }


def ours(workdir: Path, size: int, clients: int) -> tuple[float, list[float]]:
    workdir.mkdir(parents=True)
    url = f"sqlite:///{workdir / 'ledger.db'}"
    migrate(url, workdir / "logs" / "migrate.log")
    run_id = create_run(url, "bench", workdir / "logs" / "run.log")
    token = admin_token(url)
    processes: list[Process] = [start_coordinator(workdir, url)]
    coordinator = processes[0].url
    assert coordinator is not None
    try:

        def grant(address: str, role: str) -> None:
            reply = httpx.post(
                f"{coordinator}/v1/admin/roles",
                json={"address": address, "role": role},
                headers={"authorization": f"Bearer {token}"},
            )
            reply.raise_for_status()

        trainer = Account.create()
        grant(trainer.address, "trainer")
        for name, kind in (("origin", "origin"), ("relay", "relay")):
            wallet = workdir / f"{name}.json"
            grant(create_wallet(wallet, PASSWORD, scrypt_n=THROWAWAY_SCRYPT_N), "relay")
            upstreams = [] if kind == "origin" else [processes[1].url]
            processes.append(
                start_relay(workdir, name, wallet, PASSWORD, coordinator, upstreams=upstreams, origin=kind == "origin")
            )
        relay_url = processes[2].url
        while len(httpx.get(f"{coordinator}/v1/relays").json()) < 2:
            time.sleep(0.05)

        source = step_dir(workdir / "origin", run_id, 1)
        write_step(source, size)
        waiting = [
            subprocess.Popen(
                [sys.executable, "-c", CLIENT, coordinator, run_id, str(workdir / f"client-{i}")],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            for i in range(clients)
        ]
        time.sleep(3)  # the clients finish importing

        latencies: list[float] = []
        probing = threading.Event()

        def probe() -> None:
            with httpx.Client(timeout=10) as http:
                while not probing.is_set():
                    for target in (f"{relay_url}/v1/steps", f"{coordinator}/v1/manifests/{run_id}/latest"):
                        started = time.perf_counter()
                        http.get(target)
                        latencies.append(time.perf_counter() - started)
                    time.sleep(0.05)

        start = time.perf_counter()
        with CoordinatorClient(coordinator, trainer) as api:
            api.publish_manifest(publish_step(workdir / "origin", run_id, 1, trainer))
        prober = threading.Thread(target=probe)
        prober.start()
        for client in waiting:
            assert client.stdin is not None
            client.stdin.write("go\n")
            client.stdin.flush()
        for client in waiting:
            out, _ = client.communicate(timeout=600)
            if client.returncode != 0 or "done" not in out:
                raise RuntimeError(f"a client failed (exit {client.returncode})")
        elapsed = time.perf_counter() - start
        probing.set()
        prober.join()
        expected = file_hashes(source)
        assert all(file_hashes(workdir / f"client-{i}") == expected for i in range(clients))
        return elapsed, latencies
    finally:
        for process in reversed(processes):
            process.stop()


def naive(workdir: Path, size: int, clients: int) -> float:
    source = workdir / "origin"
    write_step(source, size)
    files = [p.relative_to(source).as_posix() for p in sorted(source.rglob("*")) if p.is_file()]
    expected = file_hashes(source)
    servers: list[Process] = []

    def http_server(directory: Path) -> str:
        port = free_port()
        servers.append(
            spawn(
                "http",
                [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(directory)],
                workdir / "http.log",
            )
        )
        url = f"http://127.0.0.1:{port}"
        while True:
            try:
                httpx.get(url)
                return url
            except httpx.HTTPError:
                time.sleep(0.05)

    def curl_all(url: str, dest: Path) -> subprocess.Popen[bytes]:
        args = ["curl", "-sf", "--create-dirs"]
        for name in files:
            args += ["-o", str(dest / name), f"{url}/{name}"]
        return subprocess.Popen(args)

    try:
        origin_url = http_server(source)
        (workdir / "relay").mkdir()
        relay_url = http_server(workdir / "relay")
        start = time.perf_counter()
        if curl_all(origin_url, workdir / "relay").wait() != 0:
            raise RuntimeError("curl from the origin failed")
        copies = [curl_all(relay_url, workdir / f"client-{i}") for i in range(clients)]
        if any(c.wait() != 0 for c in copies):
            raise RuntimeError("curl from the relay failed")
        if any(file_hashes(workdir / f"client-{i}") != expected for i in range(clients)):
            raise RuntimeError("a naive copy differs")
        return time.perf_counter() - start
    finally:
        for server in servers:
            server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="200,1024", help="step sizes in MiB, comma-separated")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument(
        "--repeats", type=int, default=3, help="runs of each side per size, alternating; ratios are paired run by run"
    )
    args = parser.parse_args()
    ratios: dict[int, list[float]] = {}
    for mib in (int(s) for s in args.sizes.split(",")):
        for repeat in range(1, args.repeats + 1):
            with tempfile.TemporaryDirectory() as tmp:
                ours_s, latencies = ours(Path(tmp) / "ours", mib << 20, args.clients)
            with tempfile.TemporaryDirectory() as tmp:
                naive_s = naive(Path(tmp), mib << 20, args.clients)
            ratios.setdefault(mib, []).append(ours_s / naive_s)
            p50 = statistics.median(latencies) * 1000 if latencies else float("nan")
            worst = max(latencies) * 1000 if latencies else float("nan")
            print(
                f"{mib:5d} MiB to {args.clients} clients, run {repeat}: ours {ours_s:6.2f} s "
                f"({args.clients * mib / ours_s:6.0f} MiB/s delivered), naive two-hop {naive_s:6.2f} s; "
                f"metadata during download p50 {p50:.1f} ms, max {worst:.1f} ms ({len(latencies)} requests)",
                flush=True,
            )
    print(
        f"ratio ours / naive, median (range) of {args.repeats} (target <= 1.2): "
        + ", ".join(f"{mib} MiB {statistics.median(r):.2f}x ({min(r):.2f}-{max(r):.2f})" for mib, r in ratios.items())
    )


if __name__ == "__main__":
    shutil.which("curl") or sys.exit("this benchmark needs curl")
    main()
