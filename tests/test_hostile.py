"""Hostile clients: bodies that trickle in, floods of connections from one address, more body
bytes at once than the coordinator holds, and signatures that are valid but come from the wrong party. Each gets a clear 4xx, records
nothing, and leaves other nodes unaffected."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import httpx
import pytest
from eth_account import Account

from intellect_protocol.coordinator.settings import CoordinatorSettings
from intellect_protocol.node.work import finish, generate
from intellect_protocol.shared.schemas import SamplingParams
from intellect_protocol.shared.signing import sign_request
from tests.conftest import LIFTED, Served, admin_token, serve
from tests.helpers import HTTP, heartbeat_body, make_run, register_body, signed_post
from tests.support.protocol import lease, upload


def joined(served: Served, local_address: str | None = None):
    account = Account.create()
    assert signed_post(served.url, "/v1/nodes/register", account, served.audience, register_body(account)).status_code == 200
    return account


def trickle(
    served: Served, declared: int, pause_s: float, source: str = "127.0.0.1", path: str = "/v1/nodes/heartbeat"
) -> tuple[int, float]:
    """POST a body one byte per ``pause_s``; returns the status the server answered with and when."""
    host, port = served.url.removeprefix("http://").split(":")
    started = time.monotonic()
    with socket.create_connection((host, int(port)), source_address=(source, 0), timeout=30) as conn:
        head = f"POST {path} HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\ncontent-length: {declared}\r\n\r\n"
        conn.sendall(head.encode())
        conn.settimeout(pause_s)
        reply = b""
        for _ in range(declared):
            try:
                reply = conn.recv(4096)
                break
            except TimeoutError:
                try:
                    conn.sendall(b" ")
                except OSError:
                    break
        conn.settimeout(30)
        reply = reply or conn.recv(4096)
    return int(reply.split(b" ", 2)[1]), time.monotonic() - started


@pytest.fixture
def strict(sqlite_url: str, tmp_path: Path):
    settings = CoordinatorSettings(
        database_url=sqlite_url,
        blob_dir=tmp_path / "blobs",
        **LIFTED,
        body_idle_timeout_s=0.5,
        body_deadline_s=2.0,
        max_requests_per_ip=6,
    )
    with serve(settings) as served:
        yield served


def test_a_body_that_trickles_in_gets_408_and_others_are_unaffected(strict: Served) -> None:
    before = strict.snapshot()
    status, took = trickle(strict, declared=400, pause_s=0.2)  # a byte every 0.2 s: only the deadline catches it
    assert status == 408 and 1.8 < took < 4
    status, took = trickle(strict, declared=400, pause_s=5)  # headers, then silence: the idle timeout
    assert status == 408 and took < 2
    assert strict.snapshot() == before


def test_a_node_is_answered_while_a_slow_sender_is_held(sqlite_url: str, tmp_path: Path) -> None:
    """Judged by order, not by a wall-clock bound: the heartbeat's answer comes while the slow body is still held
    open (a server that waited on it would answer only after the 30 s deadline)."""
    settings = CoordinatorSettings(
        database_url=sqlite_url, blob_dir=tmp_path / "blobs", body_idle_timeout_s=1.0, body_deadline_s=30.0
    )
    with serve(settings) as served:
        node = joined(served)
        host, port = served.url.removeprefix("http://").split(":")
        done = threading.Event()

        def slow_sender() -> None:
            with socket.create_connection((host, int(port)), timeout=30) as conn:
                head = f"POST /v1/nodes/heartbeat HTTP/1.1\r\nhost: {host}\r\ncontent-length: 400\r\n\r\n"
                conn.sendall(head.encode())
                while not done.wait(0.2):
                    conn.sendall(b" ")

        slow = threading.Thread(target=slow_sender)
        slow.start()
        time.sleep(0.3)
        assert signed_post(served.url, "/v1/nodes/heartbeat", node, served.audience, heartbeat_body(node)).status_code == 200
        assert slow.is_alive(), "the heartbeat was answered only after the slow sender was let go"
        done.set()
        slow.join()


def test_a_flood_of_connections_from_one_address_gets_429_and_others_are_unaffected(strict: Served) -> None:
    holders = [threading.Thread(target=trickle, args=(strict, 400, 0.2, "127.0.0.1")) for _ in range(6)]
    for t in holders:
        t.start()
    time.sleep(0.5)  # all six are now in flight, each holding its request open
    flooded = HTTP.get(f"{strict.url}/v1/public/time")
    assert flooded.status_code == 429 and flooded.json()["code"] == "rate_limited" and flooded.headers["retry-after"]
    # Another address (loopback has a whole /8) is served as usual.
    other = httpx.Client(transport=httpx.HTTPTransport(local_address="127.0.0.2"))
    assert other.get(f"{strict.url}/v1/public/time").status_code == 200
    for t in holders:
        t.join()
    assert HTTP.get(f"{strict.url}/v1/public/time").status_code == 200  # the slots are free again


def test_bodies_in_flight_stay_within_the_memory_budget(sqlite_url: str, tmp_path: Path) -> None:
    settings = CoordinatorSettings(
        database_url=sqlite_url,
        blob_dir=tmp_path / "blobs",
        body_idle_timeout_s=0.5,
        body_deadline_s=2.0,
        max_body_bytes_in_flight=2 << 20,
    )
    with serve(settings) as served:
        make_run(served, sampling=SamplingParams(max_tokens=4), prompts=1, samples=2)
        node = joined(served)
        task = lease(served, node)
        data = finish(generate(task)).data
        # An upload is streamed to disk, a signer's own share at a time: outside the budget, it is refused
        # from its headers (no signature here), whatever it declares.
        assert trickle(served, 3_000_000, 0.2, "127.0.0.6", "/v1/submissions?task=t")[0] == 401
        # Two senders from two addresses each declare a megabyte and trickle it: the budget is nearly spent.
        holders = [threading.Thread(target=trickle, args=(served, 1_000_000, 0.2, f"127.0.0.{i}")) for i in (3, 4)]
        for t in holders:
            t.start()
        time.sleep(0.5)
        third = trickle(served, 1_000_000, 0.2, "127.0.0.5")
        assert third[0] == 503 and third[1] < 1  # refused before a byte of its body was read
        busy = HTTP.post(f"{served.url}/v1/nodes/heartbeat", content=b" " * 200_000, headers={"content-type": "application/json"})
        assert busy.status_code == 503 and busy.json()["code"] == "overloaded" and busy.headers["retry-after"] == "2"
        # A node's small request still fits beside them, and its upload goes through (counted at its declared
        # size, it was refused 503 for as long as strangers held the budget, until its lease ran out).
        assert signed_post(served.url, "/v1/nodes/heartbeat", node, served.audience, heartbeat_body(node)).status_code == 200
        upload(served, node, task, data)
        for t in holders:
            t.join()
        # Their 408s gave the budget back.
        assert trickle(served, 1_000_000, 0.2, "127.0.0.5")[0] == 408


def test_valid_signatures_from_the_wrong_party_are_refused_and_record_nothing(coordinator: Served) -> None:
    make_run(coordinator)
    token = admin_token(coordinator)
    cheat, stranger = joined(coordinator), Account.create()
    banned = HTTP.post(
        f"{coordinator.url}/v1/admin/nodes/{cheat.address}/ban",
        json={"reason": "forgery"},
        headers={"authorization": f"Bearer {token}"},
    )
    assert banned.status_code == 200
    before = coordinator.snapshot()

    reply = signed_post(coordinator.url, "/v1/tasks/lease", cheat, coordinator.audience, {"address": cheat.address})
    assert (reply.status_code, reply.json()["code"]) == (403, "node_banned")
    reply = signed_post(coordinator.url, "/v1/tasks/lease", stranger, coordinator.audience, {"address": stranger.address})
    assert (reply.status_code, reply.json()["code"]) == (404, "node_not_registered")
    reply = signed_post(coordinator.url, "/v1/nodes/heartbeat", stranger, coordinator.audience, heartbeat_body(stranger))
    assert (reply.status_code, reply.json()["code"]) == (404, "node_not_registered")
    # Roles are granted by admins only: a node's valid signature opens no admin or role-holder endpoint.
    path = f"/v1/admin/nodes/{cheat.address}/unban"
    raw = b'{"reason": "let me back in"}'
    signed = sign_request(cheat, "POST", path, "", raw, coordinator.audience)
    reply = HTTP.post(coordinator.url + path, content=raw, headers={"content-type": "application/json", **signed})
    assert (reply.status_code, reply.json()["code"]) == (401, "admin_unauthorized")
    reply = signed_post(
        coordinator.url, "/v1/validation/claim", stranger, coordinator.audience, {"address": stranger.address, "limit": 1}
    )
    assert (reply.status_code, reply.json()["code"]) == (403, "role_required")
    metrics = {"address": stranger.address, "run_id": "run-x", "step": 1, "metrics": {"loss": 1.0}}
    reply = signed_post(coordinator.url, "/v1/trainer/metrics", stranger, coordinator.audience, metrics)
    assert (reply.status_code, reply.json()["code"]) == (403, "role_required")
    # A signature made for another deployment, and one replayed after the window, are refused too.
    reply = signed_post(coordinator.url, "/v1/nodes/heartbeat", cheat, "another-deployment", heartbeat_body(cheat))
    assert (reply.status_code, reply.json()["code"]) == (401, "signature_invalid")
    old = int(time.time()) - coordinator.settings.signature_window_s - 5
    reply = signed_post(coordinator.url, "/v1/nodes/heartbeat", cheat, coordinator.audience, heartbeat_body(cheat), timestamp=old)
    assert (reply.status_code, reply.json()["code"]) == (401, "timestamp_out_of_window")
    assert coordinator.snapshot() == before


def test_inputs_the_fuzzer_found_get_4xx(coordinator: Served) -> None:
    """Regressions from the schemathesis run: non-ASCII digits, NUL bytes (PostgreSQL refuses them in text)."""
    node = joined(coordinator)
    token = admin_token(coordinator, "operate")
    before = coordinator.snapshot()
    assert HTTP.get(f"{coordinator.url}/v1/manifests/run-x/%C2%B9").status_code in (404, 422)
    reply = signed_post(coordinator.url, "/v1/submissions", node, coordinator.audience, b"x", query="task=a%00b")
    assert reply.status_code == 422 and reply.json()["code"] == "validation_error"
    headers = {
        **sign_request(node, "POST", "/v1/nodes/heartbeat", "", b"{}", coordinator.audience),
        "x-intellect-timestamp": b"\xb9",
    }
    reply = HTTP.post(f"{coordinator.url}/v1/nodes/heartbeat", content=b"{}", headers=headers)
    assert (reply.status_code, reply.json()["code"]) == (401, "signature_malformed")
    reply = HTTP.post(
        f"{coordinator.url}/v1/admin/nodes/{node.address}/ban",
        json={"reason": "a\x00b"},
        headers={"authorization": f"Bearer {token}"},
    )
    assert reply.status_code == 422
    assert coordinator.snapshot() == before
