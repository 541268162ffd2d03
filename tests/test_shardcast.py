"""Shardcast end to end on loopback: a real coordinator, real `intellect-relay` processes (origin
and relays), real downloads; plus the manifest's own checks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import blake3
import httpx
import pytest
from eth_account import Account
from eth_account.signers.local import LocalAccount

from intellect_protocol.coordinator.settings import CoordinatorSettings
from intellect_protocol.devnet.processes import Process, start_relay
from intellect_protocol.shared.coordinator_client import CoordinatorClient
from intellect_protocol.shared.shardcast.client import PROGRESS_FILE, DownloadError, download_step
from intellect_protocol.shared.shardcast.manifest import ManifestError, build_manifest, sign_manifest
from intellect_protocol.shared.shardcast.origin import publish_step, step_dir
from intellect_protocol.shared.shardcast.server import create_server
from intellect_protocol.shared.shardcast.store import StepStore
from intellect_protocol.shared.wallet import THROWAWAY_SCRYPT_N, create_wallet
from tests.conftest import LIFTED, Served, admin_token, serve
from tests.helpers import HTTP, make_run, signed_post

PASSWORD = "relay-pass"
CHUNK = 64 * 1024


def write_model(directory: Path, size: int, seed: int) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps({"model_type": "llama", "seed": seed}))
    (directory / "model.safetensors").write_bytes(os.urandom(size))
    (directory / "tokenizer").mkdir(exist_ok=True)
    (directory / "tokenizer" / "vocab.json").write_text(json.dumps({str(i): i for i in range(50)}))


@dataclass
class Net:
    served: Served
    workdir: Path
    run_id: str
    admin: str
    trainer: LocalAccount
    processes: list[Process]

    def grant(self, address: str, role: str) -> None:
        reply = HTTP.post(
            f"{self.served.url}/v1/admin/roles",
            json={"address": address, "role": role},
            headers={"authorization": f"Bearer {self.admin}"},
        )
        assert reply.status_code == 201, reply.text

    def relay(self, name: str, *, upstreams: list[str] = (), origin: bool = False, extra: list[str] = ()) -> Process:
        wallet = self.workdir / "wallets" / f"{name}.json"
        self.grant(create_wallet(wallet, PASSWORD, scrypt_n=THROWAWAY_SCRYPT_N), "relay")
        process = start_relay(
            self.workdir, name, wallet, PASSWORD, self.served.url, upstreams=list(upstreams), origin=origin, extra=list(extra)
        )
        self.processes.append(process)
        deadline = time.monotonic() + 20
        while process.url not in [r["url"] for r in HTTP.get(f"{self.served.url}/v1/relays").json()]:
            assert time.monotonic() < deadline and process.popen.poll() is None, process.tail()
            time.sleep(0.05)
        return process

    def publish(self, origin: Process, step: int, size: int) -> dict:
        directory = step_dir(self.workdir / origin.name, self.run_id, step)
        write_model(directory, size, step)
        signed = publish_step(self.workdir / origin.name, self.run_id, step, self.trainer, chunk_size=CHUNK)
        with CoordinatorClient(self.served.url, self.trainer) as api:
            return api.publish_manifest(signed).model_dump(mode="json")


@pytest.fixture
def net(sqlite_url: str, tmp_path: Path) -> Iterator[Net]:
    settings = CoordinatorSettings(
        database_url=sqlite_url,
        **LIFTED,
        blob_dir=tmp_path / "b",
    )
    with serve(settings) as served:
        trainer = Account.create()
        network = Net(served, tmp_path, make_run(served), admin_token(served), trainer, [])
        network.grant(trainer.address, "trainer")
        try:
            yield network
        finally:
            for process in network.processes:
                process.stop()


def same_files(a: Path, b: Path) -> bool:
    names = sorted(p.relative_to(a).as_posix() for p in a.rglob("*") if p.is_file() and not p.name.startswith(("manifest", ".")))
    return bool(names) and all((a / n).read_bytes() == (b / n).read_bytes() for n in names)


def held(process: Process, run_id: str, step: int) -> int:
    reply = HTTP.get(f"{process.url}/v1/runs/{run_id}/steps/{step}/chunks")
    return len(reply.json()["held"]) if reply.status_code == 200 else -1


def test_origin_relay_relay_three_clients_end_identical(net: Net) -> None:
    origin = net.relay("origin", origin=True)
    first = net.relay("relay-1", upstreams=[origin.url])
    second = net.relay("relay-2", upstreams=[first.url])
    entry = net.publish(origin, 1, 3 * 2**20 + 12345)
    chunks = len(entry["signed"]["manifest"]["chunks"])

    results: dict[int, object] = {}

    def client(i: int) -> None:
        try:
            results[i] = download_step(
                CoordinatorClient(net.served.url), net.run_id, 1, net.workdir / f"client-{i}", concurrency=4
            )
        except BaseException as e:  # surfaced by the assertion below
            results[i] = e

    threads = [threading.Thread(target=client, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    source = step_dir(net.workdir / "origin", net.run_id, 1)
    for i in range(3):
        assert not isinstance(results[i], BaseException), results[i]
        assert same_files(source, net.workdir / f"client-{i}")
        assert (net.workdir / f"client-{i}" / "manifest.json").exists()
        assert not (net.workdir / f"client-{i}" / PROGRESS_FILE).exists()
    # The second-level relay fetched everything through the first one.
    deadline = time.monotonic() + 30
    while held(second, net.run_id, 1) < chunks:
        assert time.monotonic() < deadline, second.tail()
        time.sleep(0.1)
    assert same_files(source, net.workdir / "relay-2" / net.run_id / "1")
    steps = HTTP.get(f"{second.url}/v1/steps").json()
    assert steps == [{"run_id": net.run_id, "step": 1, "chunks": chunks, "held": chunks}]


def flip_every_chunk(directory: Path) -> None:
    path = directory / "model.safetensors"
    data = bytearray(path.read_bytes())
    for offset in range(0, len(data), CHUNK):
        data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.fixture
def evil_relay(net: Net) -> Iterator[str]:
    """A real server holding a copy of the step with bytes flipped in every model chunk, registered as a relay."""
    import uvicorn

    from intellect_protocol.devnet.processes import free_port

    store_dir = net.workdir / "evil"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    account = Account.create()
    net.grant(account.address, "relay")
    reply = signed_post(net.served.url, "/v1/relays", account, net.served.audience, {"address": account.address, "url": url})
    assert reply.status_code == 200, reply.text
    server = uvicorn.Server(
        uvicorn.Config(create_server(StepStore(store_dir, complete_on_disk=True)), port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    yield url
    server.should_exit = True
    thread.join(10)


def test_a_relay_flipping_bytes_is_caught_reported_and_routed_around(net: Net, evil_relay: str) -> None:
    origin = net.relay("origin", origin=True)
    honest = net.relay("relay-1", upstreams=[origin.url])
    entry = net.publish(origin, 1, 2 * 2**20)
    # The evil relay serves the real manifest over tampered bytes.
    evil_step = net.workdir / "evil" / net.run_id / "1"
    evil_step.parent.mkdir(parents=True)
    import shutil

    shutil.copytree(step_dir(net.workdir / "origin", net.run_id, 1), evil_step)
    flip_every_chunk(evil_step)

    reporter = Account.create()
    download_step(CoordinatorClient(net.served.url, reporter), net.run_id, 1, net.workdir / "client", concurrency=4)
    assert same_files(step_dir(net.workdir / "origin", net.run_id, 1), net.workdir / "client")

    relays = HTTP.get(f"{net.served.url}/v1/admin/relays", headers={"authorization": f"Bearer {net.admin}"}).json()
    reports = {r["url"]: r["reports"] for r in relays}
    assert reports[evil_relay] >= 1
    assert reports[honest.url] == 0 and reports[origin.url] == 0
    assert entry["step"] == 1


def test_a_relay_killed_mid_download_leaves_clients_to_the_others(net: Net) -> None:
    origin = net.relay("origin", origin=True)
    doomed = net.relay("relay-1", upstreams=[origin.url])
    net.relay("relay-2", upstreams=[origin.url])
    net.publish(origin, 1, 8 * 2**20)
    for relay in net.processes[1:]:
        while held(relay, net.run_id, 1) < 128:
            time.sleep(0.05)

    killed = []

    def kill_at_a_third(done: int, total: int) -> None:
        if not killed and done > total // 3:
            doomed.kill()
            killed.append(done)

    download_step(
        CoordinatorClient(net.served.url), net.run_id, 1, net.workdir / "client", concurrency=4, on_progress=kill_at_a_third
    )
    assert killed and doomed.popen.poll() is not None
    assert same_files(step_dir(net.workdir / "origin", net.run_id, 1), net.workdir / "client")


CLIENT = """
import os, sys
from intellect_protocol.shared.coordinator_client import CoordinatorClient
from intellect_protocol.shared.shardcast.client import download_step
def stop_half_way(done, total):
    if done > total // 2:
        os._exit(9)
first = []
download_step(CoordinatorClient(sys.argv[1]), sys.argv[2], 1, __import__("pathlib").Path(sys.argv[3]), concurrency=2,
              on_progress=stop_half_way if sys.argv[4] == "die" else lambda d, t: first.append(d) if not first else None)
print("resumed-from", first[0] if first else -1)
"""


def test_a_killed_client_resumes_with_only_what_is_missing(net: Net) -> None:
    origin = net.relay("origin", origin=True)
    chunks = net.publish(origin, 1, 4 * 2**20)["signed"]["manifest"]["chunks"]
    dest = net.workdir / "client"
    args = [sys.executable, "-c", CLIENT, net.served.url, net.run_id, str(dest)]
    died = subprocess.run([*args, "die"], capture_output=True, text=True, cwd=Path(__file__).parent.parent)
    assert died.returncode == 9, died.stderr
    logged = (dest / PROGRESS_FILE).read_text().split()[1:]
    assert 0 < len(logged) < 64
    again = subprocess.run([*args, "resume"], capture_output=True, text=True, cwd=Path(__file__).parent.parent)
    assert again.returncode == 0, again.stderr
    # The restart started from every chunk the first run had verified, not from zero.
    resumed_from = int(again.stdout.split()[-1])
    assert resumed_from == sum(chunks[int(i)]["length"] for i in logged)
    assert same_files(step_dir(net.workdir / "origin", net.run_id, 1), dest)


def test_manifests_need_a_trainer_and_a_good_signature(net: Net) -> None:
    directory = net.workdir / "step"
    write_model(directory, 100_000, 1)
    manifest = build_manifest(directory, net.run_id, 1, chunk_size=CHUNK)
    outsider = Account.create()
    before = net.served.snapshot()
    # Not a trainer.
    reply = signed_post(
        net.served.url, "/v1/manifests", outsider, net.served.audience, sign_manifest(manifest, outsider).model_dump()
    )
    assert reply.status_code == 403 and reply.json()["code"] == "role_required"
    # A trainer posting a manifest someone else signed.
    reply = signed_post(
        net.served.url, "/v1/manifests", net.trainer, net.served.audience, sign_manifest(manifest, outsider).model_dump()
    )
    assert reply.status_code == 403 and reply.json()["code"] == "manifest_signer_mismatch"
    # A trainer's signature over a different manifest (a hash changed afterwards).
    forged = sign_manifest(manifest, net.trainer).model_dump()
    forged["manifest"]["chunks"][0]["blake3"] = "0" * 64
    reply = signed_post(net.served.url, "/v1/manifests", net.trainer, net.served.audience, forged)
    assert reply.status_code == 422 and reply.json()["code"] == "manifest_invalid"
    # Unsafe paths and chunk lists that do not tile the files never validate.
    bad_path = sign_manifest(manifest, net.trainer).model_dump()
    bad_path["manifest"]["files"][0]["path"] = "../../etc/passwd"
    assert signed_post(net.served.url, "/v1/manifests", net.trainer, net.served.audience, bad_path).status_code == 422
    assert net.served.snapshot() == before

    # Accepted from the trainer (idempotent), then refused by clients once the role is revoked.
    good = sign_manifest(manifest, net.trainer).model_dump()
    for _ in range(2):
        assert signed_post(net.served.url, "/v1/manifests", net.trainer, net.served.audience, good).status_code == 201
    other = build_manifest(directory, net.run_id, 1, chunk_size=CHUNK * 2)
    reply = signed_post(
        net.served.url, "/v1/manifests", net.trainer, net.served.audience, sign_manifest(other, net.trainer).model_dump()
    )
    assert reply.status_code == 409
    revoked = HTTP.delete(
        f"{net.served.url}/v1/admin/roles/{net.trainer.address}/trainer", headers={"authorization": f"Bearer {net.admin}"}
    )
    assert revoked.status_code == 200
    with pytest.raises(DownloadError, match="trainer role"):
        download_step(CoordinatorClient(net.served.url), net.run_id, 1, net.workdir / "client")


def test_manifest_signatures_and_layout_checks() -> None:
    account = Account.create()
    directory = Path(__file__).parent.parent / "shared" / "assets" / "tiny-arith"
    manifest = build_manifest(directory, "run-1", 3, chunk_size=2**20)
    signed = sign_manifest(manifest, account)
    assert signed.verify({account.address}) == manifest
    with pytest.raises(ManifestError, match="trainer role"):
        signed.verify({Account.create().address})
    tampered = signed.model_copy(update={"manifest": manifest.model_copy(update={"step": 4})})
    with pytest.raises(ManifestError, match="not signed by"):
        tampered.verify()
    with pytest.raises(ValueError, match="tile"):
        type(manifest).model_validate({**manifest.model_dump(), "chunks": manifest.model_dump()["chunks"][:-1]})


@pytest.mark.unit
@pytest.mark.parametrize("chunk_size", [2**20 + 2**19, 3 * 2**20, 5 * 2**20])
def test_each_chunk_hash_is_the_blake3_of_its_bytes(tmp_path: Path, chunk_size: int) -> None:
    # Chunks longer than the 1 MiB read piece, not a multiple of it, and a last chunk cut short.
    (tmp_path / "config.json").write_text("{}")
    data = os.urandom(4 * 2**20 + 12345)
    (tmp_path / "model.safetensors").write_bytes(data)
    manifest = build_manifest(tmp_path, "run-1", 1, chunk_size=chunk_size)
    weights = [c for c in manifest.chunks if manifest.files[c.file].path == "model.safetensors"]
    assert [c.offset for c in weights] == list(range(0, len(data), chunk_size))
    assert sum(c.length for c in weights) == len(data)
    assert all(c.blake3 == blake3.blake3(data[c.offset : c.offset + c.length]).hexdigest() for c in weights)


def test_retention_waits_for_the_grace_period_and_for_readers(net: Net) -> None:
    origin = net.relay("origin", origin=True, extra=["--keep", "1", "--grace-s", "1"])
    relay = net.relay("relay-1", upstreams=[origin.url], extra=["--keep", "1", "--grace-s", "1"])
    size = 24 * 2**20  # more than loopback's socket buffers hold, so the server is still sending
    net.publish(origin, 1, size)
    while held(relay, net.run_id, 1) < size // CHUNK + 2:
        time.sleep(0.05)
    origin_step1 = step_dir(net.workdir / "origin", net.run_id, 1)
    relay_step1 = net.workdir / "relay-1" / net.run_id / "1"

    # A slow reader holds step 1 open on the origin while step 2 replaces it.
    with httpx.stream("GET", f"{origin.url}/v1/runs/{net.run_id}/steps/1/files/model.safetensors") as reading:
        pieces = reading.iter_raw(65536)
        next(pieces)
        step2_chunks = len(net.publish(origin, 2, 2**20)["signed"]["manifest"]["chunks"])
        time.sleep(5)  # well past the grace period and several prune rounds
        assert origin_step1.exists()
        deadline = time.monotonic() + 20
        while relay_step1.exists():  # the relay has no reader: it lets go after the grace period
            assert time.monotonic() < deadline
            time.sleep(0.1)
        assert sum(len(p) for p in pieces) + 65536 == size  # the reader still gets every byte
    deadline = time.monotonic() + 20
    while origin_step1.exists():
        assert time.monotonic() < deadline, origin.tail()
        time.sleep(0.1)
    assert step_dir(net.workdir / "origin", net.run_id, 2).exists()
    deadline = time.monotonic() + 20
    while held(relay, net.run_id, 2) < step2_chunks:
        assert time.monotonic() < deadline, relay.tail()
        time.sleep(0.1)


def test_a_node_downloads_the_published_step_and_generates_with_it(net: Net) -> None:
    import shutil

    from sqlalchemy import select

    from intellect_protocol.coordinator.db import make_sessionmaker
    from intellect_protocol.coordinator.models import Node, Task
    from intellect_protocol.devnet.processes import start_node
    from intellect_protocol.shared.models import TINY_MODEL_DIR

    origin = net.relay("origin", origin=True)
    net.relay("relay-1", upstreams=[origin.url])
    # The trainer's step 1: here the base model's files, saved where the origin serves them.
    shutil.copytree(TINY_MODEL_DIR, step_dir(net.workdir / "origin", net.run_id, 1))
    signed = publish_step(net.workdir / "origin", net.run_id, 1, net.trainer, chunk_size=CHUNK)
    with CoordinatorClient(net.served.url, net.trainer) as api:
        api.publish_manifest(signed)

    # Heartbeats tell every node the newest step of each active run, so it can fetch ahead.
    from tests.helpers import heartbeat_body, register_body

    listener = Account.create()
    signed_post(net.served.url, "/v1/nodes/register", listener, net.served.audience, register_body(listener))
    beat = signed_post(net.served.url, "/v1/nodes/heartbeat", listener, net.served.audience, heartbeat_body(listener)).json()
    assert beat["policy_steps"] == {net.run_id: 1}

    wallet = net.workdir / "node.json"
    create_wallet(wallet, "pw", scrypt_n=THROWAWAY_SCRYPT_N)
    node = start_node(net.workdir, "node-1", wallet, net.served.url, "pw")
    net.processes.append(node)
    sessions = make_sessionmaker(net.served.engine)
    deadline = time.monotonic() + 120
    while True:
        with sessions() as session:
            done = session.scalars(select(Task).where(Task.status == "submitted")).all()
            beats = session.scalars(select(Node.last_heartbeat).where(Node.address != listener.address)).all()
        if done and any(beat and beat.get("weights") == {net.run_id: 1} for beat in beats):
            break
        assert time.monotonic() < deadline and node.popen.poll() is None, node.tail()
        time.sleep(0.3)
    assert all(task.policy_step == 1 for task in done)
    held = net.workdir / "state" / "node-1"
    assert same_files(TINY_MODEL_DIR, next(held.rglob(f"weights/{net.run_id}/1")))


def test_source_picker_prefers_fast_relays_explores_and_falls_back_to_the_origin() -> None:
    import random

    from intellect_protocol.shared.shardcast.client import Source, SourcePicker

    origin, fast, slow = Source("o", "origin"), Source("f", "relay"), Source("s", "relay")
    picker = SourcePicker([origin, fast, slow], explore=0.0, rng=random.Random(0))
    assert {picker.pick(set()), picker.pick({fast})} == {fast, slow}  # untried relays first
    picker.record(fast, 100 << 20, 0.1)
    picker.record(slow, 100 << 20, 1.0)
    assert picker.pick(set()) is fast
    exploring = SourcePicker([origin, fast, slow], explore=1.0, rng=random.Random(1))
    assert {exploring.pick(set()) for _ in range(50)} == {fast, slow}  # never the origin while relays remain
    for _ in range(3):
        picker.fail(fast)
    assert fast.dropped and picker.pick(set()) is slow
    assert picker.pick({slow}) is origin and picker.pick({slow, origin}) is None


def test_servers_refuse_bad_ranges_and_unknown_paths(net: Net) -> None:
    origin = net.relay("origin", origin=True)
    net.publish(origin, 1, 100_000)
    base = f"{origin.url}/v1/runs/{net.run_id}/steps/1/files"
    assert (
        HTTP.get(f"{base}/model.safetensors", headers={"Range": "bytes=10-19"}).content
        == (step_dir(net.workdir / "origin", net.run_id, 1) / "model.safetensors").read_bytes()[10:20]
    )
    for header in ("bytes=5-2", "bytes=200000-", "bytes=0-1,4-5", "pages=1-2"):
        assert HTTP.get(f"{base}/model.safetensors", headers={"Range": header}).status_code == 416
    for path in ("missing.bin", "..%2F..%2Fmanifest.json", "%2Fetc%2Fpasswd", ".held"):
        assert HTTP.get(f"{base}/{path}").status_code == 404
    assert HTTP.get(f"{origin.url}/v1/runs/{net.run_id}/steps/9/chunks").status_code == 404


def test_a_step_in_use_is_kept_however_many_newer_steps_arrive(tmp_path: Path) -> None:
    from datetime import UTC, datetime

    from rich.console import Console

    from intellect_protocol.shared.schemas import SamplingParams, TaskSpec
    from intellect_protocol.shared.shardcast.store import MANIFEST_FILE
    from intellect_protocol.shared.shardcast.weights import Weights

    run = "run-1"
    for step in range(1, 6):  # steps already verified on disk, so nothing is downloaded
        (tmp_path / run / str(step)).mkdir(parents=True)
        (tmp_path / run / str(step) / MANIFEST_FILE).write_text("{}")
    weights = Weights(CoordinatorClient("http://127.0.0.1:9"), tmp_path, Console(file=open(os.devnull, "w")))

    def task(step: int) -> TaskSpec:
        return TaskSpec(
            task_id="t",
            run_id=run,
            environment="arithmetic",
            environment_version="intellect-protocol==0.1.0",
            model="tiny-arith",
            prompt_ids=["p"],
            samples_per_prompt=1,
            seed=1,
            policy_step=step,
            sampling=SamplingParams(),
            length_alpha=0.0,
            target_length=0,
            length_over_only=False,
            lease_expires_at=datetime.now(UTC),
        )

    in_use = weights.model_for(task(1), pin=True)
    weights.ensure(run, 5)  # a prefetch prunes to the newest two, but not the step a task is using
    assert sorted(p.name for p in (tmp_path / run).iterdir()) == ["1", "4", "5"]
    assert Path(in_use, MANIFEST_FILE).exists()
    weights.unpin(task(1))
    weights.ensure(run, 5)
    assert sorted(p.name for p in (tmp_path / run).iterdir()) == ["4", "5"]
    # A validator judging older work than the newest two steps gets that step, not a path its own
    # pruning just removed (it crashed loading a deleted directory under the chaos run's backlog).
    (tmp_path / run / "2").mkdir()
    (tmp_path / run / "2" / MANIFEST_FILE).write_text("{}")  # as if just downloaded
    assert Path(weights.model_for(task(2)), MANIFEST_FILE).exists()
