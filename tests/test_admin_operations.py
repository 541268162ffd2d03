"""The operator's API beyond nodes: every endpoint's authorization, runs and tasks, submissions,
the ledger export, tokens made and revoked through the API, the audit log; and the public
leaderboard's JSON built from the same real submissions."""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime, timedelta
from pathlib import Path

from eth_account import Account
from rich.console import Console

from intellect_protocol.coordinator.settings import CoordinatorSettings
from intellect_protocol.node.work import finish, generate
from intellect_protocol.shared.schemas import SamplingParams, TaskSpec
from intellect_protocol.shared.tolerances import TOLERANCES
from intellect_protocol.validator.worker import Validator
from tests.conftest import LIFTED, Served, admin_token, serve
from tests.helpers import HTTP, make_run, signed_post
from tests.support.protocol import grant
from tests.test_tasks_and_uploads import joined, lease, rollout_file, upload

ADDRESS = "0x" + "ab" * 20
EXPECTED_SCOPE = {
    ("GET", "/v1/admin/nodes"): "read",
    ("GET", "/v1/admin/nodes/{address}"): "read",
    ("POST", "/v1/admin/nodes/{address}/ban"): "operate",
    ("POST", "/v1/admin/nodes/{address}/unban"): "operate",
    ("GET", "/v1/admin/runs"): "read",
    ("POST", "/v1/admin/runs"): "operate",
    ("GET", "/v1/admin/runs/{run_id}"): "read",
    ("PATCH", "/v1/admin/runs/{run_id}"): "operate",
    ("POST", "/v1/admin/runs/{run_id}/pause"): "operate",
    ("POST", "/v1/admin/runs/{run_id}/resume"): "operate",
    ("POST", "/v1/admin/runs/{run_id}/evaluations"): "operate",
    ("GET", "/v1/admin/tasks"): "read",
    ("POST", "/v1/admin/tasks/{task_id}/requeue"): "operate",
    ("GET", "/v1/admin/submissions"): "read",
    ("GET", "/v1/admin/submissions/{submission_id}"): "read",
    ("POST", "/v1/admin/submissions/{submission_id}/invalidate"): "operate",
    ("GET", "/v1/admin/roles"): "read",
    ("POST", "/v1/admin/roles"): "admin",
    ("DELETE", "/v1/admin/roles/{address}/{role}"): "admin",
    ("GET", "/v1/admin/relays"): "read",
    ("GET", "/v1/admin/tokens"): "admin",
    ("POST", "/v1/admin/tokens"): "admin",
    ("DELETE", "/v1/admin/tokens/{token_id}"): "admin",
    ("GET", "/v1/admin/ledger"): "read",
    ("GET", "/v1/admin/audit"): "read",
}
PARAMS = {
    "address": ADDRESS,
    "run_id": "run-x",
    "task_id": "task-x",
    "submission_id": "sub-x",
    "role": "relay",
    "token_id": "999",
}


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


def audit(served: Served, token: str) -> list[dict]:
    return HTTP.get(f"{served.url}/v1/admin/audit", headers=bearer(token)).json()


def test_every_admin_endpoint_checks_its_token_and_records_nothing_when_refused(coordinator) -> None:
    paths = HTTP.get(f"{coordinator.url}/openapi.json").json()["paths"]
    routes = {(m.upper(), p) for p, ops in paths.items() if p.startswith("/v1/admin") for m in ops}
    assert routes == set(EXPECTED_SCOPE), "a new admin endpoint needs its scope in this table"

    tokens = {scope: admin_token(coordinator, scope) for scope in ("read", "operate", "admin")}
    revoked = HTTP.post(
        f"{coordinator.url}/v1/admin/tokens", json={"name": "old", "scope": "admin"}, headers=bearer(tokens["admin"])
    )
    assert revoked.status_code == 201
    gone = HTTP.delete(f"{coordinator.url}/v1/admin/tokens/{revoked.json()['id']}", headers=bearer(tokens["admin"]))
    assert gone.status_code == 200 and gone.json()["revoked_at"] is not None

    before = coordinator.snapshot()
    for (method, template), scope in EXPECTED_SCOPE.items():
        url = coordinator.url + template.format(**PARAMS)
        for headers, status, code in (
            ({}, 401, "admin_unauthorized"),
            (bearer(revoked.json()["token"]), 401, "admin_unauthorized"),
            (bearer(f"ipa_{revoked.json()['id']}_{'x' * 43}"), 401, "admin_unauthorized"),
            *([(bearer(tokens["read"]), 403, "admin_forbidden")] if scope != "read" else []),
            *([(bearer(tokens["operate"]), 403, "admin_forbidden")] if scope == "admin" else []),
        ):
            reply = HTTP.request(method, url, json={}, headers=headers)
            assert (reply.status_code, reply.json()["code"]) == (status, code), (method, template, headers, reply.text)
    assert coordinator.snapshot() == before


def test_runs_and_tasks_through_the_api(sqlite_url: str, tmp_path: Path) -> None:
    settings = CoordinatorSettings(
        database_url=sqlite_url,
        blob_dir=tmp_path / "blobs",
        **LIFTED,
    )
    with serve(settings) as served:
        ops = bearer(admin_token(served, "operate"))
        runs = f"{served.url}/v1/admin/runs"
        body = {
            "name": "arith",
            "environment": "arithmetic",
            "prompts_per_task": 2,
            "samples_per_prompt": 2,
            "sampling": {"temperature": 1.0, "max_tokens": 8},
            "dispute_window_s": 60,
            "prompting": {"system_prompt": "Be brief."},
        }
        created = HTTP.post(runs, json=body, headers=ops)
        assert created.status_code == 201, created.text
        run = created.json()
        assert run["status"] == "active" and run["dispute_window_s"] == 60 and run["async_level"] == 2
        assert run["prompting"] == {"system_prompt": "Be brief.", "enable_thinking": None}
        assert run["environment_version"].startswith("intellect-protocol sha256=")
        too_long = {**body, "name": "e", "prompting": {"system_prompt": "x" * 16_385}}
        assert HTTP.post(runs, json=too_long, headers=ops).status_code == 422
        assert HTTP.post(runs, json=body, headers=ops).json()["code"] == "conflict"
        assert HTTP.post(runs, json={**body, "name": "b", "environment": "poetry"}, headers=ops).status_code == 422
        assert HTTP.post(runs, json={**body, "name": "c", "samples_per_prompt": 0}, headers=ops).status_code == 422
        assert HTTP.post(runs, json={**body, "name": "d", "colour": "red"}, headers=ops).status_code == 422

        first = joined(served)
        old_task = lease(served, first).json()
        assert old_task["samples_per_prompt"] == 2 and old_task["prompting"]["system_prompt"] == "Be brief."
        assert old_task["environment_version"] == run["environment_version"]
        update = {"samples_per_prompt": 3, "sampling": {"temperature": 0.7, "max_tokens": 8}, "length_alpha": 0.001}
        update |= {"prompting": {"enable_thinking": False}, "length_over_only": True}
        updated = HTTP.patch(f"{runs}/{run['id']}", json=update, headers=ops).json()
        assert updated["samples_per_prompt"] == 3 and updated["length_budget"]["alpha"] == 0.001
        assert (
            updated["length_budget"]["over_only"] is True
            and updated["length_budget"]["target_tokens"] == run["length_budget"]["target_tokens"]
        )
        assert HTTP.patch(f"{runs}/{run['id']}", json={"name": "renamed"}, headers=ops).status_code == 422
        assert HTTP.patch(f"{runs}/run-nope", json={"async_level": 1}, headers=ops).status_code == 404

        # Work handed out before the update keeps its settings; new work gets the new ones.
        assert lease(served, first).json() == old_task
        assert upload(served, first, old_task["task_id"], rollout_file(old_task)).status_code == 200
        second = joined(served)
        new_task = lease(served, second).json()
        assert new_task["samples_per_prompt"] == 3 and new_task["sampling"]["temperature"] == 0.7
        assert new_task["prompting"] == {"system_prompt": None, "enable_thinking": False}
        assert (new_task["length_alpha"], new_task["length_over_only"]) == (0.001, True)
        assert old_task["length_over_only"] is False

        assert HTTP.post(f"{runs}/{run['id']}/pause", headers=ops).json()["status"] == "paused"
        assert HTTP.post(f"{runs}/{run['id']}/pause", headers=ops).status_code == 409
        assert lease(served, joined(served)).status_code == 204
        assert HTTP.post(f"{runs}/{run['id']}/resume", headers=ops).json()["status"] == "active"

        tasks = f"{served.url}/v1/admin/tasks"
        leased = HTTP.get(tasks, params={"run_id": run["id"], "status": "leased"}, headers=ops).json()
        assert [t["id"] for t in leased] == [new_task["task_id"]] and leased[0]["leased_to"] == second.address
        requeued = HTTP.post(f"{tasks}/{new_task['task_id']}/requeue", headers=ops).json()
        assert requeued["status"] == "open" and requeued["leased_to"] is None
        assert HTTP.post(f"{tasks}/{new_task['task_id']}/requeue", headers=ops).status_code == 409
        assert HTTP.post(f"{tasks}/{old_task['task_id']}/requeue", headers=ops).status_code == 409  # submitted
        assert lease(served, joined(served)).json()["task_id"] == new_task["task_id"]
        assert upload(served, second, new_task["task_id"], rollout_file(new_task)).status_code == 403

        evaluation = {"step": 0, "metrics": {"heldout_accuracy": 0.61}}
        assert HTTP.post(f"{runs}/{run['id']}/evaluations", json=evaluation, headers=ops).status_code == 201
        bad = HTTP.post(f"{runs}/{run['id']}/evaluations", content=b'{"step": 1, "metrics": {"x": NaN}}', headers=ops)
        assert bad.status_code == 422
        progress = HTTP.get(f"{served.url}/v1/public/runs/{run['id']}/progress").json()
        assert progress["evaluations"] == [{"step": 0, "heldout_accuracy": 0.61}]

        actions = [(e["action"], e["target"], e["token_name"]) for e in audit(served, ops["authorization"][7:])]
        assert actions == [
            ("runs.evaluate", run["id"], "test-operate"),
            ("tasks.requeue", new_task["task_id"], "test-operate"),
            ("runs.resume", run["id"], "test-operate"),
            ("runs.pause", run["id"], "test-operate"),
            ("runs.update", run["id"], "test-operate"),
            ("runs.create", "arith", "test-operate"),
        ]

        # Recalibrated on request: new work is judged by the new bounds, which the public config shows;
        # bounds below the floor are refused and change nothing.
        floor = TOLERANCES["bfloat16"].model_dump()
        recalibrated = {"tolerances": {"vllm/bfloat16": {**floor, "max_gap": 0.1}}}
        assert HTTP.patch(f"{runs}/{run['id']}", json=recalibrated, headers=ops).status_code == 200
        narrower = {"tolerances": {"vllm/bfloat16": {**floor, "max_gap": 0.001}}}
        refused = HTTP.patch(f"{runs}/{run['id']}", json=narrower, headers=ops)
        assert refused.status_code == 422 and "below the floor" in refused.text
        public = HTTP.get(f"{served.url}/v1/public/runs/{run['id']}").json()
        assert public["tolerances"] == recalibrated["tolerances"]
        recalibrated_task = lease(served, joined(served)).json()
        assert recalibrated_task["tolerances"] == recalibrated["tolerances"] and new_task["tolerances"] is None
        assert public["tolerances_widened_by"] == round(0.1 / 0.06, 2)
        # The page says since when: the run's config records when its tolerances were set.
        set_at = datetime.fromisoformat(public["tolerances_set_at"])
        assert datetime.fromisoformat(run["created_at"]) <= set_at <= datetime.now(UTC).replace(tzinfo=set_at.tzinfo)

        # Every bound at the schema's maximum, where every forgery fits: an operate token cannot set it, an
        # admin token can, and then the audit log and the public config say by how much.
        widest = {"tolerances": {"vllm/bfloat16": {**floor, "max_gap": 1e3, "logprob_bias": 1e3, "flip_scale": 1e3}}}
        before = served.snapshot()
        refused = HTTP.patch(f"{runs}/{run['id']}", json=widest, headers=ops)
        assert refused.status_code == 403 and "only an admin-scope token" in refused.json()["message"], refused.text
        assert served.snapshot() == before
        root = {"authorization": f"Bearer {admin_token(served, 'admin')}"}
        assert HTTP.patch(f"{runs}/{run['id']}", json=widest, headers=root).status_code == 200
        widened_by = HTTP.get(f"{served.url}/v1/public/runs/{run['id']}").json()["tolerances_widened_by"]
        assert widened_by == round(1e3 / 0.0015, 2)
        [entry] = [e for e in audit(served, root["authorization"][7:]) if e["token_name"] == "test-admin"]
        assert entry["action"] == "runs.update" and entry["detail"]["tolerances_widened_by"] == widened_by


def test_submissions_ledger_tokens_audit_and_leaderboard(sqlite_url: str, tmp_path: Path) -> None:
    settings = CoordinatorSettings(
        database_url=sqlite_url,
        blob_dir=tmp_path / "blobs",
        **LIFTED,
    )
    with serve(settings) as served:
        run_id = make_run(served, sampling=SamplingParams(max_tokens=48))
        root = admin_token(served, "admin")
        validator_key = Account.create()
        grant(served, root, validator_key.address, "validator")
        node, idle = joined(served), joined(served)
        ids = []
        for _ in range(2):
            task = TaskSpec.model_validate(lease(served, node).json())
            ids.append(upload(served, node, task.task_id, finish(generate(task)).data).json()["submission_id"])
        validator = Validator(served.url, validator_key, tmp_path / "v", Console(quiet=True))
        validator.run(max_submissions=2)
        validator.close()

        admin = f"{served.url}/v1/admin"
        accepted = HTTP.get(f"{admin}/submissions", params={"status": "accepted", "run_id": run_id}, headers=bearer(root)).json()
        assert sorted(s["submission_id"] for s in accepted) == sorted(ids)
        assert all(s["validator"] == validator_key.address and len(s["sha256"]) == 64 and s["tokens"] > 0 for s in accepted)
        assert HTTP.get(f"{admin}/submissions", params={"address": idle.address}, headers=bearer(root)).json() == []
        future = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
        assert HTTP.get(f"{admin}/submissions", params={"since": future}, headers=bearer(root)).json() == []
        detail = HTTP.get(f"{admin}/submissions/{ids[0]}", headers=bearer(root)).json()
        assert detail["blob_key"].endswith(".parquet") and detail["rows"] == 4
        assert HTTP.get(f"{admin}/submissions/sub-nope", headers=bearer(root)).status_code == 404

        invalidated = HTTP.post(f"{admin}/submissions/{ids[0]}/invalidate", json={"reason": "copied"}, headers=bearer(root))
        assert invalidated.status_code == 200 and invalidated.json()["credit"] == 0

        entries = HTTP.get(f"{admin}/ledger", headers=bearer(root)).json()
        # Invalidation claws back that submission's credit, and (a strike) the node's other pending credit too.
        kinds = sorted((e["kind"], e["submission_id"]) for e in entries)
        assert kinds == sorted([("credit", ids[0]), ("credit", ids[1]), ("clawback", ids[0]), ("clawback", ids[1])])
        assert sum(e["units"] for e in entries) == 0 == detail_credit(served, ids[1])
        exported = HTTP.get(f"{admin}/ledger", params={"format": "csv"}, headers=bearer(root))
        assert exported.headers["content-type"].startswith("text/csv")
        rows = list(csv.DictReader(io.StringIO(exported.text)))
        assert [(int(r["id"]), int(r["units"]), r["kind"]) for r in rows] == [(e["id"], e["units"], e["kind"]) for e in entries]
        assert HTTP.get(f"{admin}/ledger", params={"since": future}, headers=bearer(root)).json() == []
        past = (datetime.now(UTC) - timedelta(hours=1)).isoformat()
        assert HTTP.get(f"{admin}/ledger", params={"until": past, "format": "csv"}, headers=bearer(root)).text.count("\n") == 1
        assert HTTP.get(f"{admin}/ledger", params={"since": "yesterday"}, headers=bearer(root)).status_code == 422

        made = HTTP.post(f"{admin}/tokens", json={"name": "grafana", "scope": "read"}, headers=bearer(root)).json()
        assert made["scope"] == "read" and made["token"].startswith(f"ipa_{made['id']}_")
        assert HTTP.get(f"{admin}/nodes", headers=bearer(made["token"])).status_code == 200
        assert (
            HTTP.post(f"{admin}/tokens", json={"name": "x", "scope": "admin"}, headers=bearer(made["token"])).status_code == 403
        )
        listed = HTTP.get(f"{admin}/tokens", headers=bearer(root)).json()
        assert {t["name"] for t in listed} >= {"grafana", "test-admin"} and all("token" not in t for t in listed)
        assert HTTP.delete(f"{admin}/tokens/{made['id']}", headers=bearer(root)).status_code == 200
        assert HTTP.get(f"{admin}/nodes", headers=bearer(made["token"])).status_code == 401
        assert HTTP.delete(f"{admin}/tokens/424242", headers=bearer(root)).status_code == 404

        log = audit(served, root)
        assert [e["action"] for e in log] == ["tokens.revoke", "tokens.create", "submissions.invalidate", "roles.grant"]
        assert log[2]["detail"] == {"reason": "copied"} and log[2]["target"] == ids[0]
        assert audit(served, root) == HTTP.get(f"{admin}/audit", params={"since": past}, headers=bearer(root)).json()
        assert HTTP.get(f"{admin}/audit", params={"until": past}, headers=bearer(root)).json() == []

        # The public leaderboard's JSON, from the same ledger.
        board = HTTP.get(f"{served.url}/v1/public/leaderboard").json()
        assert [r["address"] for r in board] == [node.address, idle.address]
        top = board[0]
        assert (top["rank"], top["accepted"], top["rejected"], top["acceptance_rate"]) == (1, 1, 1, 0.5)
        assert top["pending_credit"] == detail_credit(served, ids[1]) and top["accepted_tokens"] == accepted_tokens(
            served, ids[1]
        )
        network = HTTP.get(f"{served.url}/v1/public/network").json()
        assert (network["policy_step"], network["validation_backlog"], network["rejection_rate"]) == (0, 0, 0.5)
        assert network["run"]["id"] == run_id
        buckets = HTTP.get(f"{served.url}/v1/public/runs/{run_id}/throughput", params={"minutes": 5, "bucket_s": 60}).json()
        assert len(buckets) == 5 and sum(b["rollouts"] for b in buckets) == 8
        # All 8 came within the last minute: the card's rate is the chart's, not diluted over five minutes.
        assert network["rollouts_per_minute"] == 8
        assert sum(b["accepted_tokens"] for b in buckets) == accepted_tokens(served, ids[1])
        public = HTTP.get(f"{served.url}/v1/public/nodes/{node.address}").json()
        assert public["submissions"] == {"accepted": 1, "invalidated": 1} and public["credit"]["pending"] == top["pending_credit"]
        assert HTTP.get(f"{served.url}/v1/public/nodes/{ADDRESS}").status_code == 404
        assert signed_post(served.url, "/v1/admin/nodes", node, served.audience, {}).status_code in (401, 405)


def detail_credit(served: Served, submission_id: str) -> float:
    return HTTP.get(f"{served.url}/v1/public/submissions/{submission_id}").json()["credit"]


def accepted_tokens(served: Served, submission_id: str) -> int:
    token = admin_token(served, "read")
    return HTTP.get(f"{served.url}/v1/admin/submissions/{submission_id}", headers=bearer(token)).json()["tokens"]
