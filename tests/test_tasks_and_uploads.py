"""Leasing tasks and uploading rollout files: each refusal is clear and changes nothing."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import httpx
from eth_account import Account

from intellect_protocol.coordinator.settings import CoordinatorSettings
from intellect_protocol.shared.models import resolve_model
from intellect_protocol.shared.rollout_file import Rollout, write_rollouts
from intellect_protocol.shared.schemas import DEFAULT_MODEL, sequence_seed
from intellect_protocol.shared.signing import sign_request
from tests.conftest import serve
from tests.helpers import HTTP, make_run, register_body, signed_post
from tests.support.clock import MovableClock


def joined(served):
    account = Account.create()
    assert signed_post(served.url, "/v1/nodes/register", account, served.audience, register_body(account)).status_code == 200
    return account


def lease(served, account) -> httpx.Response:
    return signed_post(served.url, "/v1/tasks/lease", account, served.audience, {"address": account.address})


def rollout_file(task: dict, **changes: object) -> bytes:
    rows = []
    index = 0
    for prompt_id in task["prompt_ids"]:
        for _ in range(task["samples_per_prompt"]):
            fields = {
                "task_id": task["task_id"],
                "run_id": task["run_id"],
                "policy_step": task["policy_step"],
                "prompt_id": prompt_id,
                "prompt_tokens": [1, 4, 5],
                "completion_tokens": [6, 7, 2],
                "logprobs": [-0.5, -0.5, -0.5],
                "finish_reason": "stop",
                "reward": 1.0,
                "task_reward": 1.0,
                "length_penalty": 0.0,
                "target_length": 0,
                "seed": sequence_seed(task["seed"], index),
                "proofs": b"",
            }
            fields.update(changes)
            rows.append(Rollout(**fields))
            index += 1
    return write_rollouts(rows)


def upload(served, account, task_id: str, data: bytes) -> httpx.Response:
    query = f"task={task_id}"
    headers = sign_request(account, "POST", "/v1/submissions", query, data, served.audience)
    return HTTP.post(
        f"{served.url}/v1/submissions?{query}", content=data, headers={"content-type": "application/octet-stream", **headers}
    )


def test_no_run_means_no_work(coordinator) -> None:
    assert lease(coordinator, joined(coordinator)).status_code == 204


def test_lease_upload_and_idempotent_receipt(coordinator) -> None:
    make_run(coordinator)
    node = joined(coordinator)
    task = lease(coordinator, node).json()
    assert len(task["prompt_ids"]) == 2 and task["samples_per_prompt"] == 2
    assert lease(coordinator, node).json()["task_id"] == task["task_id"]  # the held task, not a new one
    other = lease(coordinator, joined(coordinator)).json()
    assert other["task_id"] != task["task_id"] and set(other["prompt_ids"]).isdisjoint(task["prompt_ids"])

    data = rollout_file(task)
    first = upload(coordinator, node, task["task_id"], data)
    assert first.status_code == 200, first.text
    receipt = first.json()
    assert receipt["status"] == "pending" and receipt["rows"] == 4 and receipt["sha256"] == hashlib.sha256(data).hexdigest()
    stored = coordinator.settings.blob_dir / task["run_id"] / task["task_id"] / f"{receipt['sha256']}.parquet"
    assert stored.read_bytes() == data

    before = coordinator.snapshot()
    again = upload(coordinator, node, task["task_id"], data)
    assert again.status_code == 200 and again.json() == receipt
    different = upload(coordinator, node, task["task_id"], rollout_file(task, reward=0.5, task_reward=0.5))
    assert different.status_code == 409 and different.json()["code"] == "conflict"
    after = coordinator.snapshot()
    assert {k: v for k, v in after.items() if k != "nonces"} == {k: v for k, v in before.items() if k != "nonces"}


def test_refusals_change_nothing(coordinator) -> None:
    make_run(coordinator)
    node, stranger = joined(coordinator), joined(coordinator)
    task = lease(coordinator, node).json()
    before = coordinator.snapshot()
    cases = [
        (upload(coordinator, stranger, task["task_id"], rollout_file(task)), 403, "task_not_leased"),
        (upload(coordinator, node, "task-nope", rollout_file(task)), 404, "not_found"),
        (upload(coordinator, node, task["task_id"], b"PAR1 not really"), 422, "rollout_invalid"),
        (upload(coordinator, node, task["task_id"], rollout_file(task, seed=5)), 422, "rollout_invalid"),
        (upload(coordinator, node, task["task_id"], rollout_file(task, policy_step=9)), 422, "rollout_invalid"),
        (
            upload(coordinator, node, task["task_id"], rollout_file({**task, "prompt_ids": task["prompt_ids"][:1]})),
            422,
            "rollout_invalid",
        ),
    ]
    for response, status, code in cases:
        assert response.status_code == status, response.text
        assert response.json()["code"] == code
    assert coordinator.snapshot() == before
    assert not any(coordinator.settings.blob_dir.rglob("*.parquet"))


def test_expired_lease_returns_to_the_pool(sqlite_url: str, tmp_path: Path) -> None:
    clock = MovableClock()
    settings = CoordinatorSettings(database_url=sqlite_url, task_lease_s=60, blob_dir=tmp_path / "b", max_upload_bytes=20_000)
    with serve(settings, clock=clock) as c:
        make_run(c)
        slow, quick = joined(c), joined(c)
        task = lease(c, slow).json()
        clock.advance(61)
        before = c.snapshot()
        late = upload(c, slow, task["task_id"], rollout_file(task))
        assert late.status_code == 409 and late.json()["code"] == "lease_expired"
        assert c.snapshot() == before
        assert lease(c, quick).json()["task_id"] == task["task_id"]
        assert upload(c, slow, task["task_id"], rollout_file(task)).json()["code"] == "task_not_leased"

        big = upload(c, quick, task["task_id"], b"x" * 30_000)
        assert big.status_code == 413 and big.json()["code"] == "body_too_large"
        assert upload(c, quick, task["task_id"], rollout_file(task)).status_code == 200


def test_banned_or_unknown_nodes_get_no_work(coordinator) -> None:
    make_run(coordinator)
    stranger = Account.create()
    assert lease(coordinator, stranger).json()["code"] == "node_not_registered"


def test_run_create_cli(sqlite_url: str) -> None:
    # The ledger's PostgreSQL path through the CLI is the token commands' test; one kind is enough here.
    database_url = sqlite_url
    result = subprocess.run(
        [
            "intellect-coordinator",
            "run",
            "create",
            "--name",
            "demo",
            "--environment",
            "arithmetic",
            "--database-url",
            database_url,
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert result.stdout.strip().startswith("run-") and "not calibrated" not in result.stderr
    # Another model without its calibration: created, with a warning saying how to calibrate it.
    other = str(resolve_model(DEFAULT_MODEL))
    uncalibrated = subprocess.run(
        ["intellect-coordinator", "run", "create", "--name", "other", "--model", other, "--database-url", database_url],
        capture_output=True,
        text=True,
    )
    assert uncalibrated.returncode == 0 and uncalibrated.stdout.strip().startswith("run-")
    assert f"is not calibrated on {other}" in uncalibrated.stderr and "intellect-validator calibrate" in uncalibrated.stderr
    again = subprocess.run(
        ["intellect-coordinator", "run", "create", "--name", "demo", "--database-url", database_url],
        capture_output=True,
        text=True,
    )
    assert again.returncode == 2 and "exists already" in again.stderr and "Traceback" not in again.stderr
    bad = subprocess.run(
        ["intellect-coordinator", "run", "create", "--name", "x", "--environment", "poetry", "--database-url", database_url],
        capture_output=True,
        text=True,
    )
    assert (
        bad.returncode == 2
        and "environment 'poetry' is not installed; installed: arithmetic, calculator, code, long-sum, math" in bad.stderr
    )


def test_a_node_holds_at_most_three_tasks(coordinator) -> None:
    make_run(coordinator)
    node = joined(coordinator)
    first = lease(coordinator, node).json()
    body = {"address": node.address, "working_on": [first["task_id"]]}
    second = signed_post(coordinator.url, "/v1/tasks/lease", node, coordinator.audience, body).json()
    assert second["task_id"] != first["task_id"]
    # Restarted, the node gets back a task it holds rather than a third one.
    assert lease(coordinator, node).json()["task_id"] in {first["task_id"], second["task_id"]}
    body = {"address": node.address, "working_on": [first["task_id"], second["task_id"]]}
    third = signed_post(coordinator.url, "/v1/tasks/lease", node, coordinator.audience, body).json()
    before = coordinator.snapshot()
    body = {"address": node.address, "working_on": [first["task_id"], second["task_id"], third["task_id"]]}
    fourth = signed_post(coordinator.url, "/v1/tasks/lease", node, coordinator.audience, body)
    assert fourth.status_code == 409 and "already holds 3" in fourth.json()["message"]
    assert {k: v for k, v in coordinator.snapshot().items() if k != "nonces"} == {
        k: v for k, v in before.items() if k != "nonces"
    }


def test_an_unwritable_blob_store_gets_503_and_records_nothing(coordinator) -> None:
    make_run(coordinator)
    node = joined(coordinator)
    task = lease(coordinator, node).json()
    data = rollout_file(task)
    blobs = coordinator.settings.blob_dir
    blobs.mkdir(parents=True, exist_ok=True)
    away = blobs.with_name("blobs-away")
    blobs.rename(away)
    blobs.write_bytes(b"")  # a file where the directory was: every write and read fails, as on a lost mount
    query = f"task={task['task_id']}"
    headers = {
        "content-type": "application/octet-stream",
        **sign_request(node, "POST", "/v1/submissions", query, data, coordinator.audience),
    }
    before = coordinator.snapshot()
    refused = HTTP.post(f"{coordinator.url}/v1/submissions?{query}", content=data, headers=headers)
    assert refused.status_code == 503, refused.text
    assert refused.json()["code"] == "storage_unavailable" and refused.headers["retry-after"] == "5"
    assert coordinator.snapshot() == before  # not even the nonce: the very same request may be sent again

    blobs.unlink()
    away.rename(blobs)
    again = HTTP.post(f"{coordinator.url}/v1/submissions?{query}", content=data, headers=headers)
    assert again.status_code == 200, again.text
    assert (blobs / task["run_id"] / task["task_id"] / f"{again.json()['sha256']}.parquet").read_bytes() == data


def test_new_work_waits_while_the_validation_backlog_is_full(sqlite_url: str, tmp_path: Path) -> None:
    settings = CoordinatorSettings(
        database_url=sqlite_url, blob_dir=tmp_path / "b", max_validation_backlog=2, rate_limit_burst=1000
    )
    with serve(settings) as c:
        make_run(c)
        first, second, third = joined(c), joined(c), joined(c)
        task = lease(c, first).json()
        assert lease(c, second).status_code == 200  # two tasks in progress: the backlog is full
        assert lease(c, third).status_code == 204
        assert upload(c, first, task["task_id"], rollout_file(task)).status_code == 200
        assert lease(c, third).status_code == 204  # a pending submission counts as much as a task in progress
        assert lease(c, first).status_code == 204


def test_a_task_older_than_the_runs_window_is_never_handed_out_again(sqlite_url: str, tmp_path: Path) -> None:
    from intellect_protocol.coordinator.db import make_sessionmaker
    from intellect_protocol.coordinator.models import Run

    clock = MovableClock()
    with serve(CoordinatorSettings(database_url=sqlite_url, task_lease_s=60, blob_dir=tmp_path / "b"), clock=clock) as c:
        run_id = make_run(c)
        first, second = joined(c), joined(c)
        old = lease(c, first).json()
        assert old["policy_step"] == 0
        clock.advance(61)  # its lease ran out while the run moved on past its window (async level 2)
        with make_sessionmaker(c.engine).begin() as session:
            session.get_one(Run, run_id).policy_step = 3
        fresh = lease(c, second).json()
        assert fresh["task_id"] != old["task_id"] and fresh["policy_step"] == 3
        assert lease(c, first).json()["task_id"] not in (old["task_id"], fresh["task_id"])


def test_tasks_a_run_left_behind_do_not_count_against_a_nodes_limit(coordinator) -> None:
    from intellect_protocol.coordinator.db import make_sessionmaker
    from intellect_protocol.coordinator.models import Run

    run_id = make_run(coordinator)
    node = joined(coordinator)
    held: list[str] = []
    for _ in range(3):
        body = {"address": node.address, "working_on": held}
        held.append(signed_post(coordinator.url, "/v1/tasks/lease", node, coordinator.audience, body).json()["task_id"])
    with make_sessionmaker(coordinator.engine).begin() as session:
        session.get_one(Run, run_id).policy_step = 3  # all three are now older than the run's window
    # Restarted, the node knows none of them: it gets new work, not "already holds 3 tasks".
    fresh = lease(coordinator, node)
    assert fresh.status_code == 200, fresh.text
    assert fresh.json()["task_id"] not in held and fresh.json()["policy_step"] == 3
