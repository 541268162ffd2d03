"""Attacks an independent attacker made against a live coordinator, each reproduced through the
real API: deep JSON, a Parquet token bomb, media-type tricks, extreme dates, half-sent headers,
free soft rejections, free new wallets, runs that can never be submitted."""

from __future__ import annotations

import io
import json
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from eth_account import Account
from sqlalchemy import update

from intellect_protocol.coordinator.db import make_sessionmaker
from intellect_protocol.coordinator.models import Node, Run
from intellect_protocol.coordinator.settings import CoordinatorSettings
from intellect_protocol.shared.rollout_file import SCHEMA
from intellect_protocol.shared.run_schemas import AuditPolicy
from intellect_protocol.shared.schemas import CHECKS
from intellect_protocol.shared.signing import sign_request
from tests.conftest import LIFTED, ON_POSTGRES_ONLY, Served, admin_token, serve
from tests.helpers import HTTP, checks_for, heartbeat_body, make_run, register_body, signed_post, verdict_body
from tests.support.protocol import grant
from tests.test_hostile import joined
from tests.test_tasks_and_uploads import lease, rollout_file, upload

ROLE_ENTRY_MODULES = (
    "intellect_protocol.coordinator.cli",
    "intellect_protocol.node.cli",
    "intellect_protocol.validator.cli",
    "intellect_protocol.trainer.cli",
    "intellect_protocol.shared.shardcast.cli",
    "intellect_protocol.devnet.cli",
)


def nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


def test_no_role_runs_with_a_raised_recursion_limit() -> None:
    # eth_account first, as a careless import order would: py_ecc raises the limit to 100000.
    code = f"import eth_account, sys; import {', '.join(ROLE_ENTRY_MODULES)}; print(sys.getrecursionlimit())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "1000"


def test_deeply_nested_json_is_refused_and_the_coordinator_stays_up(coordinator: Served) -> None:
    node = joined(coordinator)
    before = coordinator.snapshot()
    bodies = [
        ("/v1/admin/roles", nested(120_000), {}),  # unauthenticated: refused before the token check
        ("/v1/nodes/heartbeat", nested(200_000), {}),  # unsigned
    ]
    for path, body, headers in bodies:
        reply = HTTP.post(coordinator.url + path, content=body, headers={"content-type": "application/json", **headers})
        assert 400 <= reply.status_code < 500, reply.text
    signed = signed_post(coordinator.url, "/v1/nodes/heartbeat", node, coordinator.audience, nested(200_000))
    assert 400 <= signed.status_code < 500
    assert coordinator.snapshot() == before
    assert (
        signed_post(coordinator.url, "/v1/nodes/heartbeat", node, coordinator.audience, heartbeat_body(node)).status_code == 200
    )


@pytest.mark.parametrize(
    "media_type", ["Application/JSON", "application/merge-patch+json", "APPLICATION/JSON; charset=utf-8", ""]
)
def test_every_spelling_of_json_gets_the_json_guards(sqlite_url: str, tmp_path: Path, media_type: str) -> None:
    with serve(CoordinatorSettings(database_url=sqlite_url, blob_dir=tmp_path / "b")) as served:
        node, other = joined(served), Account.create()
        before = served.snapshot()
        for body, status, code in [
            (heartbeat_body(node, address=other.address), 401, "address_mismatch"),
            (heartbeat_body(node, activity="idle\u0000"), 422, "validation_error"),
        ]:
            raw = httpx.Request("POST", "/", json=body).content
            headers = sign_request(node, "POST", "/v1/nodes/heartbeat", "", raw, served.audience)
            reply = HTTP.post(f"{served.url}/v1/nodes/heartbeat", content=raw, headers={"content-type": media_type, **headers})
            assert (reply.status_code, reply.json()["code"]) == (status, code), reply.text
        assert served.snapshot() == before


def test_a_nul_escape_split_between_two_body_parts_is_still_refused(coordinator: Served) -> None:
    node = joined(coordinator)
    raw = httpx.Request("POST", "/", json=heartbeat_body(node, activity="idle\u0000")).content
    cut = raw.index(b"\\u0000") + 3  # the escape's first three bytes in one part, the rest in the next
    headers = sign_request(node, "POST", "/v1/nodes/heartbeat", "", raw, coordinator.audience)
    reply = HTTP.post(
        f"{coordinator.url}/v1/nodes/heartbeat",
        content=iter([raw[:cut], raw[cut:]]),
        headers={"content-type": "application/json", **headers},
    )
    assert reply.status_code == 422 and reply.json()["code"] == "validation_error"


@pytest.mark.parametrize("path", ["/v1/admin/audit", "/v1/admin/ledger", "/v1/admin/submissions"])
def test_times_outside_the_datetime_range_are_422(coordinator: Served, path: str) -> None:
    token = admin_token(coordinator)
    for field in ("since", "until"):
        for value in ("0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-14:00"):
            reply = HTTP.get(coordinator.url + path, params={field: value}, headers={"authorization": f"Bearer {token}"})
            assert reply.status_code == 422 and reply.json()["code"] == "validation_error", (field, value, reply.text)
    assert (
        HTTP.get(
            coordinator.url + path, params={"since": "2026-01-01T00:00:00+14:00"}, headers={"authorization": f"Bearer {token}"}
        ).status_code
        == 200
    )


@pytest.fixture
def guarded(sqlite_url: str, tmp_path: Path):
    settings = CoordinatorSettings(
        database_url=sqlite_url,
        blob_dir=tmp_path / "blobs",
        header_timeout_s=1.0,
        max_connections_per_ip=6,
        max_header_bytes=8192,
    )
    with serve(settings) as served:
        yield served


def _half_sent(served: Served, source: str = "127.0.0.1") -> socket.socket:
    host, port = served.url.removeprefix("http://").split(":")
    conn = socket.create_connection((host, int(port)), source_address=(source, 0), timeout=10)
    conn.sendall(b"POST /v1/nodes/heartbeat HTTP/1.1\r\nhost: x\r\ncontent-type: appl")
    return conn


def _answer(conn: socket.socket) -> bytes:
    try:
        return conn.recv(4096)
    except (ConnectionResetError, TimeoutError):
        return b""


def test_half_sent_headers_are_bounded_in_time_count_and_size(guarded: Served) -> None:
    node = joined(guarded)
    started = time.monotonic()
    held = [_half_sent(guarded) for _ in range(10)]  # more than the 6 connections one address may hold
    answers = [_answer(conn) for conn in held]
    assert sum(a.startswith(b"HTTP/1.1 429") for a in answers) == 4
    assert sum(a.startswith(b"HTTP/1.1 408") for a in answers) == 6
    assert time.monotonic() - started < 5  # the six waited out the 1 s header deadline, not more
    for conn in held:
        assert _answer(conn) == b""  # every one of them closed (a reset too: the server left our bytes unread)
        conn.close()

    host, port = guarded.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as conn:
        conn.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\nx-big: " + b"a" * (1 << 20))
        assert _answer(conn).startswith(b"HTTP/1.1 431")

    # Others are answered meanwhile, and so is this address once its connections are gone.
    attackers = [_half_sent(guarded, "127.0.0.2") for _ in range(6)]
    assert signed_post(guarded.url, "/v1/nodes/heartbeat", node, guarded.audience, heartbeat_body(node)).status_code == 200
    for conn in attackers:
        conn.close()


def token_bomb(task: dict, tokens: int) -> bytes:
    """The task's own rows, the first completion ``tokens`` zeros: a few KB that decode to 4 bytes a token."""
    table = pq.read_table(io.BytesIO(rollout_file(task)))
    completions = table.column("completion_tokens").to_pylist()
    lengths = [tokens] + [len(c) for c in completions[1:]]
    values = np.concatenate([np.zeros(tokens, np.int32)] + [np.asarray(c, np.int32) for c in completions[1:]])
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    table = table.set_column(
        SCHEMA.get_field_index("completion_tokens"), "completion_tokens", pa.ListArray.from_arrays(offsets, values)
    )
    buffer = io.BytesIO()
    pq.write_table(table.cast(SCHEMA), buffer, compression="zstd")
    return buffer.getvalue()


@ON_POSTGRES_ONLY
def test_a_token_bomb_is_refused_at_once_without_stalling_other_nodes(coordinator: Served) -> None:
    make_run(coordinator)
    node, other = joined(coordinator), joined(coordinator)
    task = lease(coordinator, node).json()
    bomb = token_bomb(task, 100_000_000)
    assert len(bomb) < 20_000
    before = coordinator.snapshot()

    answered: list[int] = []
    done = threading.Event()

    def heartbeats() -> None:
        while not answered or not done.is_set():
            reply = signed_post(coordinator.url, "/v1/nodes/heartbeat", other, coordinator.audience, heartbeat_body(other))
            answered.append(reply.status_code)

    # What the coordinator's Arrow reads allocate while the bomb is refused, counted apart from the rest of this
    # process: reading the bomb's pages would take 400 MB, refusing it from the declared sizes almost nothing.
    process_pool = pa.default_memory_pool()
    counted = pa.proxy_memory_pool(process_pool)
    pa.set_memory_pool(counted)
    beating = threading.Thread(target=heartbeats)
    beating.start()
    try:
        reply = upload(coordinator, node, task["task_id"], bomb)
    finally:
        done.set()
        beating.join()
        pa.set_memory_pool(process_pool)
    assert reply.status_code == 422 and "declares" in reply.json()["message"], reply.text
    assert counted.max_memory() < 10_000_000, counted.max_memory()
    assert set(answered) == {200}  # the other node was served meanwhile
    heartbeat_tables = ("nonces", "nodes", "node_status_events")  # the other node's heartbeats write these
    after = coordinator.snapshot()
    assert {k: v for k, v in after.items() if k not in heartbeat_tables} == {
        k: v for k, v in before.items() if k not in heartbeat_tables
    }
    assert not any(coordinator.settings.blob_root.rglob("*.parquet"))
    assert upload(coordinator, node, task["task_id"], rollout_file(task)).status_code == 200  # the honest file still lands


def test_new_wallets_per_address_are_rate_limited(sqlite_url: str, tmp_path: Path) -> None:
    with serve(CoordinatorSettings(database_url=sqlite_url, blob_dir=tmp_path / "b", registrations_per_ip_per_hour=3)) as served:
        first = [joined(served) for _ in range(3)]
        before = served.snapshot()
        fresh = Account.create()
        reply = signed_post(served.url, "/v1/nodes/register", fresh, served.audience, register_body(fresh))
        assert reply.status_code == 429 and reply.json()["code"] == "rate_limited" and int(reply.headers["retry-after"]) > 60
        assert "new nodes" in reply.json()["message"]
        assert {k: v for k, v in served.snapshot().items() if k != "nonces"} == {k: v for k, v in before.items() if k != "nonces"}
        again = signed_post(served.url, "/v1/nodes/register", first[0], served.audience, register_body(first[0]))
        assert again.status_code == 200  # an address registering again costs nothing


def _register_from(served: Served, ip: str) -> httpx.Response:
    """A fresh wallet's registration sent from the loopback address ``ip``."""
    fresh = Account.create()
    raw = json.dumps(register_body(fresh)).encode()
    headers = {"content-type": "application/json", **sign_request(fresh, "POST", "/v1/nodes/register", "", raw, served.audience)}
    with httpx.Client(transport=httpx.HTTPTransport(local_address=ip)) as client:
        return client.post(served.url + "/v1/nodes/register", content=raw, headers=headers)


@pytest.mark.parametrize(("prefix", "admitted"), [(24, 3), (32, 6)])
def test_new_wallets_per_network_share_one_allowance(sqlite_url: str, tmp_path: Path, prefix: int, admitted: int) -> None:
    """Round four: 200 wallets registered from 10 addresses in 8 s, each address with its own allowance. The
    addresses of one network (a /24 by default) now share it; the prefix is a setting."""
    settings = CoordinatorSettings(
        database_url=sqlite_url, blob_dir=tmp_path / "b", registrations_per_ip_per_hour=3, registration_prefix_v4=prefix
    )
    with serve(settings) as served:
        replies = [_register_from(served, f"127.0.0.{2 + i % 2}") for i in range(8)]  # two addresses of one /24
        assert [r.status_code for r in replies].count(200) == admitted
        refused = next(r for r in replies if r.status_code == 429)
        assert refused.json()["code"] == "rate_limited" and "127.0.0." in refused.json()["message"]
        assert len(served.snapshot()["nodes"]) == admitted


def test_fresh_wallets_upload_at_the_newcomers_pace_from_one_network_and_proven_nodes_do_not(
    sqlite_url: str, tmp_path: Path
) -> None:
    """Round four: 200 fresh wallets' files arrived at once. Nodes with no accepted file upload from one network (a /24)
    at ``newcomer_uploads_per_s`` between them, after a burst of one node's leases; the next gets 429 with the time to
    retry and records nothing. A proven node on that network, and a newcomer on another, are not held to it."""
    settings = CoordinatorSettings(
        database_url=sqlite_url,
        blob_dir=tmp_path / "b",
        rate_limit_per_s=1000,
        rate_limit_burst=1000,
        newcomer_uploads_per_s=0.01,
        max_leases_per_node=2,
    )
    with serve(settings) as served:
        make_run(served, audit=AuditPolicy(share=0, new_node_share=0, suspect_share=0))
        validator = Account.create()
        grant(served, admin_token(served), validator.address, "validator")

        def upload_from(ip: str, node, task: dict | None = None) -> httpx.Response:
            task = task or lease(served, node).json()
            data, query = rollout_file(task), f"task={task['task_id']}"
            headers = sign_request(node, "POST", "/v1/submissions", query, data, served.audience)
            with httpx.Client(transport=httpx.HTTPTransport(local_address=ip)) as client:
                return client.post(f"{served.url}/v1/submissions?{query}", content=data, headers=headers)

        proven = joined(served)
        assert upload_from("127.0.0.2", proven).status_code == 200  # the network's burst: one
        body = {"address": validator.address, "limit": 1}
        [claim] = signed_post(served.url, "/v1/validation/claim", validator, served.audience, body).json()
        verdict = verdict_body(served.audience, validator, claim, checks_for("accept"))
        assert signed_post(served.url, "/v1/validation/verdicts", validator, served.audience, verdict).status_code == 200

        assert upload_from("127.0.0.3", joined(served)).status_code == 200  # and two
        newcomer = joined(served)
        task = lease(served, newcomer).json()
        before = served.snapshot()
        refused = upload_from("127.0.0.4", newcomer, task)
        assert refused.status_code == 429 and refused.json()["code"] == "rate_limited", refused.text
        assert "127.0.0.0/24" in refused.json()["message"] and int(refused.headers["retry-after"]) >= 1
        assert served.snapshot() == before
        assert upload_from("127.0.0.5", proven).status_code == 200
        assert upload_from("127.0.1.2", joined(served)).status_code == 200


def _verdict(served: Served, validator, claim: dict, failed: str) -> httpx.Response:
    checks, seen = [], False
    for name in CHECKS:
        seen = seen or name == failed
        checks.append(
            {
                "name": name,
                "passed": None if seen and name != failed else name != failed,
                "reason": f"{name} wrong" if name == failed else "",
            }
        )
    body = verdict_body(served.audience, validator, claim, checks)
    return signed_post(served.url, "/v1/validation/verdicts", validator, served.audience, body)


def test_repeated_soft_rejections_cost_a_strike_but_stale_work_never_does(database_url: str, tmp_path: Path) -> None:
    settings = CoordinatorSettings(
        database_url=database_url,
        blob_dir=tmp_path / "b",
        **LIFTED,
        soft_rejections_per_strike=3,
        max_leases_per_node=8,
        newcomer_reviews_per_s=1000,  # the newcomer's files come faster than 5 a second; the pace is not under test
    )
    with serve(settings) as served:
        run_id = make_run(served, prompts=1, samples=1)
        token = admin_token(served)
        validator = Account.create()
        reply = HTTP.post(
            f"{served.url}/v1/admin/roles",
            json={"address": validator.address, "role": "validator"},
            headers={"authorization": f"Bearer {token}"},
        )
        assert reply.status_code == 201
        node = joined(served)
        sessions = make_sessionmaker(served.engine)

        def submit_and_judge(failed: str) -> dict:
            task = lease(served, node).json()
            assert upload(served, node, task["task_id"], rollout_file(task)).status_code == 200
            claims = signed_post(
                served.url, "/v1/validation/claim", validator, served.audience, {"address": validator.address, "limit": 1}
            ).json()
            reply = _verdict(served, validator, claims[0], failed)
            assert reply.status_code == 200, reply.text
            return reply.json()

        def strikes() -> int:
            with sessions() as session:
                return session.get_one(Node, node.address).strikes

        # Work the network made stale before it was decided: expired, however often, by the coordinator.
        def claim() -> list[dict]:
            return signed_post(
                served.url, "/v1/validation/claim", validator, served.audience, {"address": validator.address, "limit": 1}
            ).json()

        for i in range(4):
            task = lease(served, node).json()
            reply = upload(served, node, task["task_id"], rollout_file(task))
            claimed = claim() if i % 2 else []  # half are being checked as the window moves on
            with sessions.begin() as session:
                session.execute(update(Run).where(Run.id == run_id).values(policy_step=Run.policy_step + 3))
            if claimed:  # a verdict that comes too late: the trainer could not use the work, so no credit either way
                assert _verdict(served, validator, claimed[0], "all").json()["status"] == "expired"
            else:  # not drawn at all: no validator spends a model pass on it
                assert claim() == []
            receipt = HTTP.get(f"{served.url}/v1/public/submissions/{reply.json()['submission_id']}").json()
            assert (
                receipt["status"] == "expired" and "fell out of the run's window" in receipt["reason"] and receipt["credit"] == 0
            )
        assert strikes() == 0

        assert [submit_and_judge("rewards")["status"] for _ in range(2)] == ["rejected", "rejected"]
        assert strikes() == 0
        third = submit_and_judge("termination")
        assert strikes() == 1 and "a strike: 3 soft rejections" in third["reason"]
        assert submit_and_judge("rewards")["status"] == "rejected" and strikes() == 1
        public = HTTP.get(f"{served.url}/v1/public/nodes/{node.address}").json()
        assert public["submissions"]["expired"] == 4 and public["submissions"]["rejected"] == 4


def test_a_run_whose_tasks_could_never_be_submitted_is_refused(coordinator: Served, tmp_path: Path) -> None:
    token = admin_token(coordinator, "operate")
    headers = {"authorization": f"Bearer {token}"}
    before = coordinator.snapshot()
    reply = HTTP.post(
        f"{coordinator.url}/v1/admin/runs",
        json={"name": "huge", "prompts_per_task": 1024, "samples_per_prompt": 256},
        headers=headers,
    )
    assert (
        reply.status_code == 422
        and "1024 prompts x 256 samples" in reply.json()["message"]
        and "at most 4096" in reply.json()["message"]
    )
    assert {k: v for k, v in coordinator.snapshot().items() if k != "audit_log"} == {
        k: v for k, v in before.items() if k != "audit_log"
    }

    run = HTTP.post(
        f"{coordinator.url}/v1/admin/runs", json={"name": "fine", "prompts_per_task": 8, "samples_per_prompt": 8}, headers=headers
    )
    assert run.status_code == 201
    patch = HTTP.patch(
        f"{coordinator.url}/v1/admin/runs/{run.json()['id']}",
        json={"samples_per_prompt": 256, "prompts_per_task": 64},
        headers=headers,
    )
    assert patch.status_code == 422
    assert HTTP.get(f"{coordinator.url}/v1/admin/runs/{run.json()['id']}", headers=headers).json()["samples_per_prompt"] == 8

    cli = subprocess.run(
        [
            "intellect-coordinator",
            "run",
            "create",
            "--name",
            "cli-huge",
            "--prompts-per-task",
            "1024",
            "--samples-per-prompt",
            "256",
            "--database-url",
            coordinator.settings.database_url,
        ],
        capture_output=True,
        text=True,
    )
    assert cli.returncode == 2 and "can never be submitted" in cli.stderr and "Traceback" not in cli.stderr
