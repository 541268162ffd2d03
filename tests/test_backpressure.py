"""Work is handed out at the rate validators and the trainer consume it, the work closest to going
stale is judged first, and a node (and the public status) is told why no work comes; nobody waiting
for work waits longer than it must (long-polled claims and trainer reads, a node asking again when told)."""

from __future__ import annotations

import io
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from eth_account import Account
from rich.console import Console
from sqlalchemy import update

from intellect_protocol.coordinator.db import make_sessionmaker
from intellect_protocol.coordinator.models import Role, Run, Submission, Task
from intellect_protocol.coordinator.routers import validation as validation_router
from intellect_protocol.coordinator.services import admission, validation
from intellect_protocol.coordinator.settings import CoordinatorSettings
from intellect_protocol.coordinator.shardcast_models import PolicyManifest
from intellect_protocol.node.client import NodeClient
from intellect_protocol.node.finishers import finisher_pool, stop_finishers, wait_ready
from intellect_protocol.node.hardware import probe
from intellect_protocol.node.settings import NodeSettings
from intellect_protocol.node.work_loop import WorkLoop
from intellect_protocol.shared.signing import SignedAuth
from tests.conftest import LIFTED, Served, admin_token, serve
from tests.helpers import HTTP, make_run, signed_post
from tests.support.protocol import claim_all
from tests.test_attacks import _verdict
from tests.test_hostile import joined
from tests.test_tasks_and_uploads import lease, rollout_file, upload


def _settings(database_url: str, tmp_path: Path, **overrides: object) -> CoordinatorSettings:
    values: dict = {
        "database_url": database_url,
        "blob_dir": tmp_path / "b",
        **LIFTED,
        "max_leases_per_node": 8,
    }
    return CoordinatorSettings(**(values | overrides))


def _grant(served: Served, role: str) -> Account:
    account = Account.create()
    reply = HTTP.post(
        f"{served.url}/v1/admin/roles",
        json={"address": account.address, "role": role},
        headers={"authorization": f"Bearer {admin_token(served)}"},
    )
    assert reply.status_code == 201
    return account


def _claim(served: Served, validator, limit: int = 1) -> list[dict]:
    return signed_post(
        served.url, "/v1/validation/claim", validator, served.audience, {"address": validator.address, "limit": limit}
    ).json()


def _wait(served: Served) -> dict | None:
    return HTTP.get(f"{served.url}/v1/public/network").json()["work"]


def test_a_node_is_told_why_no_work_comes(database_url: str, tmp_path: Path) -> None:
    with serve(_settings(database_url, tmp_path, backlog_floor=2)) as served:
        assert _wait(served)["reason"] == "no_run"
        run_id = make_run(served, prompts=1, samples=1)
        node = joined(served)
        assert _wait(served) is None
        for _ in range(2):
            task = lease(served, node).json()
            assert upload(served, node, task["task_id"], rollout_file(task)).status_code == 200

        # Nobody validates: two files wait, and the node hears why, with when to ask again.
        reply = lease(served, node)
        assert reply.status_code == 204
        assert reply.headers["x-intellect-wait"] == "no_validator" and int(reply.headers["retry-after"]) > 0
        assert "no validator has asked for work" in reply.headers["x-intellect-wait-message"]
        assert _wait(served)["reason"] == "no_validator"

        # A validator that asks, but decides nothing yet: waiting for its capacity, not for a validator.
        validator = _grant(served, "validator")
        assert len(claim_all(served, validator, limit=2)) == 2
        assert lease(served, node).headers["x-intellect-wait"] == "validation_capacity"

        # Paused by the operator: said so, to the node and on the public status.
        token = admin_token(served)
        assert (
            HTTP.post(f"{served.url}/v1/admin/runs/{run_id}/pause", headers={"authorization": f"Bearer {token}"}).status_code
            == 200
        )
        reply = lease(served, node)
        assert reply.status_code == 204 and reply.headers["x-intellect-wait"] == "paused"
        assert _wait(served) == {"reason": "paused", "message": "run r is paused by its operator", "retry_after_s": 30.0}


def test_no_trainer_reading_holds_new_work_back(database_url: str, tmp_path: Path) -> None:
    with serve(_settings(database_url, tmp_path, backlog_floor=2)) as served:
        run_id = make_run(served, prompts=1, samples=1)
        node, validator = joined(served), _grant(served, "validator")
        for _ in range(2):
            task = lease(served, node).json()
            assert upload(served, node, task["task_id"], rollout_file(task)).status_code == 200
            assert _verdict(served, validator, _claim(served, validator)[0], "all").json()["status"] == "accepted"
        reply = lease(served, node)
        assert reply.headers["x-intellect-wait"] == "no_trainer", reply.headers

        # A trainer reading everything accepted so far frees the way.
        trainer = _grant(served, "trainer")
        read = HTTP.get(
            f"{served.url}/v1/trainer/rollouts", params={"run": run_id, "after": 0}, auth=SignedAuth(trainer, served.audience)
        ).json()
        assert len(read) == 2
        HTTP.get(
            f"{served.url}/v1/trainer/rollouts",
            params={"run": run_id, "after": read[-1]["cursor"]},
            auth=SignedAuth(trainer, served.audience),
        )
        assert lease(served, node).status_code == 200


def test_new_work_follows_the_measured_decision_rate_and_step_period(database_url: str, tmp_path: Path) -> None:
    """60 decisions in the last 59 s (1.02 a second) and a policy step every 10 s with async level 2:
    work stays fresh 20 s, so 10 files (half of 20 s of decisions) may wait, not one more. The
    coordinator's clock stands still, so the rate it measures is the one stated, however long the leases take."""
    settings = _settings(database_url, tmp_path, backlog_floor=2, throughput_window_s=60)
    now = datetime.now(UTC)
    with serve(settings, clock=lambda: now) as served:
        run_id = make_run(served, prompts=1, samples=1)
        sessions = make_sessionmaker(served.engine)
        with sessions.begin() as session:
            session.add(Role(address=Account.create().address, role="validator", granted_by="t", granted_at=now, last_seen=now))
            session.add_all(
                Task(id=f"t{i}", run_id=run_id, prompt_ids={"ids": []}, seed=i, policy_step=0, status="submitted", created_at=now)
                for i in range(60)
            )
            session.flush()
            for i in range(60):
                session.add(
                    Submission(
                        id=f"s{i}",
                        task_id=f"t{i}",
                        run_id=run_id,
                        address="0x0",
                        sha256="0",
                        blob_key="k",
                        rows=1,
                        tokens=1,
                        status="accepted",
                        created_at=now,
                        validated_at=now - timedelta(seconds=59 - i),
                    )
                )
            for step in range(1, 6):
                session.add(
                    PolicyManifest(
                        run_id=run_id,
                        step=step,
                        signer="0x0",
                        digest="0",
                        total_bytes=1,
                        body="{}",
                        created_at=now - timedelta(seconds=10 * (5 - step)),
                    )
                )
            session.execute(update(Run).where(Run.id == run_id).values(policy_step=5, trainer_cursor=10**9))
        with sessions() as session:
            run = session.get_one(Run, run_id)
            assert admission.decision_rate(session, run_id, settings, now) == pytest.approx(60 / 59)
            assert admission.work_wait(session, run, settings, now) is None
        for _ in range(10):  # one task each: a node asking again would get back the task it holds
            assert lease(served, joined(served)).status_code == 200
        assert lease(served, joined(served)).headers["x-intellect-wait"] == "validation_capacity"


def test_the_policy_closest_to_going_stale_is_judged_first(database_url: str, tmp_path: Path) -> None:
    with serve(_settings(database_url, tmp_path)) as served:
        run_id = make_run(served, prompts=1, samples=1)
        slow, fast, validator = joined(served), joined(served), _grant(served, "validator")
        older = lease(served, slow).json()
        with make_sessionmaker(served.engine).begin() as session:
            session.execute(update(Run).where(Run.id == run_id).values(policy_step=1))
        newer = lease(served, fast).json()
        assert (older["policy_step"], newer["policy_step"]) == (0, 1)
        first = upload(served, fast, newer["task_id"], rollout_file(newer)).json()["submission_id"]
        second = upload(served, slow, older["task_id"], rollout_file(older)).json()["submission_id"]
        assert [c["submission_id"] for c in claim_all(served, validator, limit=2)] == [second, first]


def test_a_claim_waits_for_work_to_arrive(coordinator: Served) -> None:
    make_run(coordinator, prompts=1, samples=1)
    node, validator = joined(coordinator), _grant(coordinator, "validator")
    _claim(coordinator, validator)  # seen: live, so new work is drawn for it
    task = lease(coordinator, node).json()
    threading.Timer(1.0, lambda: upload(coordinator, node, task["task_id"], rollout_file(task))).start()
    started = time.monotonic()
    claims = signed_post(
        coordinator.url,
        "/v1/validation/claim",
        validator,
        coordinator.audience,
        {"address": validator.address, "limit": 1, "wait_s": 8},
    ).json()
    waited = time.monotonic() - started
    assert [c["task"]["task_id"] for c in claims] == [task["task_id"]] and 0.9 < waited < 8


def test_an_upload_wakes_the_validator_it_is_drawn_for_not_every_waiting_one(
    coordinator: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Round four's sybil flood: every waiting validator looked again at every upload and verdict, a claim
    transaction each, about 90 a second. Now the upload draws its validator and wakes that one: one look an upload,
    however many wait."""
    looks = []
    draw = validation.draw
    monkeypatch.setattr(validation, "draw", lambda *a: looks.append(a[1]) or draw(*a))
    monkeypatch.setattr(validation_router, "POLL_S", 60.0)  # no look on a timeout: each one counted is a wake-up's
    make_run(coordinator, prompts=1, samples=1)
    node, validators = joined(coordinator), [_grant(coordinator, "validator") for _ in range(4)]
    for v in validators:
        assert _claim(coordinator, v) == []  # seen: live, so new work is drawn for them
    task = lease(coordinator, node).json()
    got: dict[str, list] = {}

    def wait(v: Account) -> None:
        body = {"address": v.address, "limit": 1, "wait_s": 4}
        got[v.address] = signed_post(coordinator.url, "/v1/validation/claim", v, coordinator.audience, body).json()

    threads = [threading.Thread(target=wait, args=(v,)) for v in validators]
    for t in threads:
        t.start()
    while len(looks) < 8:  # each wait's first look
        time.sleep(0.01)
    time.sleep(0.2)  # and into its wait
    waited = len(looks)
    upload(coordinator, node, task["task_id"], rollout_file(task))
    while not any(got.values()):
        time.sleep(0.01)
    assert len(looks) - waited == 1
    for t in threads:
        t.join()
    assert sorted(len(c) for c in got.values()) == [0, 0, 0, 1]


def test_a_claim_never_waits_past_half_of_the_window_that_keeps_its_validator_live(sqlite_url: str, tmp_path: Path) -> None:
    # Only a claim's first look marks its validator live; were it to wait longer, work arriving late
    # in the wait would find it dead and go undrawn.
    with serve(_settings(sqlite_url, tmp_path, validator_live_s=2)) as served:
        make_run(served, prompts=1, samples=1)
        validator = _grant(served, "validator")
        started = time.monotonic()
        claims = signed_post(
            served.url, "/v1/validation/claim", validator, served.audience, {"address": validator.address, "wait_s": 8}
        ).json()
        waited = time.monotonic() - started
        assert claims == [] and 0.9 < waited < 6  # 1 s, not the 8 s asked


def test_a_trainer_waiting_for_accepted_work_is_answered_when_a_verdict_accepts_it(coordinator: Served) -> None:
    run_id = make_run(coordinator, prompts=1, samples=1)
    node, validator, trainer = joined(coordinator), _grant(coordinator, "validator"), _grant(coordinator, "trainer")
    task = lease(coordinator, node).json()
    assert upload(coordinator, node, task["task_id"], rollout_file(task)).status_code == 200
    claim = _claim(coordinator, validator)[0]
    auth = SignedAuth(trainer, coordinator.audience)

    def read(after: int, wait_s: float) -> tuple[httpx.Response, float]:
        started = time.monotonic()
        reply = HTTP.get(
            f"{coordinator.url}/v1/trainer/rollouts",
            params={"run": run_id, "after": after, "wait_s": wait_s},
            auth=auth,
            timeout=30,
        )
        return reply, time.monotonic() - started

    threading.Timer(1.0, lambda: _verdict(coordinator, validator, claim, "all")).start()
    reply, waited = read(0, 8)
    assert [e["task_id"] for e in reply.json()] == [task["task_id"]] and 0.9 < waited < 8
    # Nothing more comes: the whole wait, then nothing; a longer wait than the route allows is refused.
    reply, waited = read(reply.json()[-1]["cursor"], 1)
    assert reply.json() == [] and waited >= 1
    assert read(0, 11)[0].status_code == 422


def test_a_node_waiting_for_the_trainer_asks_again_within_a_second(sqlite_url: str, tmp_path: Path) -> None:
    with serve(_settings(sqlite_url, tmp_path, backlog_floor=1)) as served:
        run_id = make_run(served, prompts=1, samples=1)
        validator, trainer = _grant(served, "validator"), _grant(served, "trainer")
        auth = SignedAuth(trainer, served.audience)
        HTTP.get(f"{served.url}/v1/trainer/rollouts", params={"run": run_id, "after": 0}, auth=auth)  # a live trainer
        other = joined(served)
        task = lease(served, other).json()
        assert upload(served, other, task["task_id"], rollout_file(task)).status_code == 200
        assert _verdict(served, validator, _claim(served, validator)[0], "all").json()["status"] == "accepted"
        assert lease(served, joined(served)).headers["x-intellect-wait"] == "trainer_capacity"

        client = NodeClient(served.url, Account.create(), NodeSettings(state_dir=tmp_path / "node"))
        client.register(probe(tmp_path / "node"), None)
        out, finishers, stop = io.StringIO(), finisher_pool(), threading.Event()
        assert wait_ready(finishers, stop)  # started: the loop leases at once
        done: list[float] = []
        # Its heartbeat interval is 60 s here; the coordinator says to ask again in a second.
        worker = threading.Thread(
            target=lambda: done.append(
                WorkLoop(client, Console(file=out, width=300), stop, idle_wait=60.0, finishers=finishers).run(max_tasks=1)
            )
        )
        try:
            worker.start()
            time.sleep(1.5)
            assert not done and "waiting for the trainer" in out.getvalue()
            read = HTTP.get(f"{served.url}/v1/trainer/rollouts", params={"run": run_id, "after": 0}, auth=auth).json()
            freed = time.monotonic()
            HTTP.get(f"{served.url}/v1/trainer/rollouts", params={"run": run_id, "after": read[-1]["cursor"]}, auth=auth)
            worker.join(timeout=60)
            assert done == [1], out.getvalue()
            assert time.monotonic() - freed < 30  # generated and uploaded after one short wait, not the 60 s one
            assert "Work again." in out.getvalue()
        finally:
            stop.set()
            stop_finishers(finishers)
            client.close()
