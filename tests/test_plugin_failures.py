"""A plugin's bug is the plugin's: a reward that raises on a node gives the task back with one sentence, the
coordinator believes it only when its own run of the reward fails too, counts it, and pauses the run past a
bound with that sentence; a validator whose reward fails posts no verdict, so no node is struck for it."""

from __future__ import annotations

import io
import threading
import time
from pathlib import Path

import httpx
import pytest
from eth_account import Account
from rich.console import Console
from sqlalchemy import text

from intellect_protocol.coordinator.settings import CoordinatorSettings
from intellect_protocol.node.client import NodeClient
from intellect_protocol.node.finishers import finisher_pool, stop_finishers
from intellect_protocol.node.hardware import probe
from intellect_protocol.node.settings import NodeSettings
from intellect_protocol.node.work import finish, generate
from intellect_protocol.node.work_loop import WorkLoop
from intellect_protocol.shared.environments.bounded import PluginFailure
from intellect_protocol.shared.plugin_schemas import PluginFailureReport
from intellect_protocol.shared.run_schemas import AuditPolicy
from intellect_protocol.shared.schemas import SamplingParams
from intellect_protocol.validator.worker import Validator
from tests.conftest import LIFTED, admin_token, serve
from tests.helpers import HTTP, install_distribution, make_run, signed_post
from tests.support.protocol import grant, joined, lease, upload

pytestmark = pytest.mark.integration

# Fails on every completion while the file $BUGGY_FLAG exists (each reward process reads it at every call).
BUGGY = """
import os
from pathlib import Path

from intellect_protocol.shared.environments.builtin import Arithmetic


class Buggy(Arithmetic):
    name = "buggy"

    def task_reward(self, completion, problem):
        if Path(os.environ["BUGGY_FLAG"]).exists():
            return {}["answer"]
        return super().task_reward(completion, problem)
"""


@pytest.fixture
def flag(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The buggy plugin installed (on this process's path, which spawned reward processes inherit), failing."""
    install_distribution(tmp_path / "site", "intellect-buggy", "0.2.0", {"buggy": "intellect_buggy:Buggy"}, BUGGY)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    flag = tmp_path / "fail"
    flag.touch()
    monkeypatch.setenv("BUGGY_FLAG", str(flag))
    return flag


def test_a_failing_reward_gives_the_task_back_and_pauses_the_run_with_one_sentence(
    flag: Path, sqlite_url: str, tmp_path: Path
) -> None:
    settings = CoordinatorSettings(
        database_url=sqlite_url,
        blob_dir=tmp_path / "blobs",
        **LIFTED,
        plugin_failures_to_pause=2,
    )
    with serve(settings) as served:
        run_id = make_run(served, environment="buggy", sampling=SamplingParams(max_tokens=4), prompts=1, samples=2)
        # A hostile or mistaken report changes nothing: a task it does not hold, a problem not of its task, a
        # completion the coordinator's own reward scores.
        other, node = joined(served), joined(served)
        held = lease(served, node)
        report = PluginFailureReport(address=node.address, task_id=held.task_id, problem_id=held.prompt_ids[0], completion="7")
        before = served.snapshot()
        reply = signed_post(
            served.url,
            "/v1/tasks/plugin-failure",
            other,
            served.audience,
            report.model_copy(update={"address": other.address}).model_dump(),
        )
        assert reply.status_code == 403 and reply.json()["code"] == "task_not_leased"
        for _ in range(200):  # fresh wallets, each naming itself and a live task: not theirs, so nothing runs
            stranger = Account.create()
            stolen = report.model_copy(update={"address": stranger.address}).model_dump()
            reply = signed_post(served.url, "/v1/tasks/plugin-failure", stranger, served.audience, stolen)
            assert reply.status_code == 403 and reply.json()["code"] == "task_not_leased"
        reply = signed_post(
            served.url,
            "/v1/tasks/plugin-failure",
            node,
            served.audience,
            report.model_copy(update={"problem_id": "nope"}).model_dump(),
        )
        assert reply.status_code == 422 and "not one of task" in reply.json()["message"]
        flag.unlink()  # the coordinator's reward process works now: the node's failure is its own
        reply = signed_post(served.url, "/v1/tasks/plugin-failure", node, served.audience, report.model_dump())
        assert reply.status_code == 409 and reply.json()["code"] == "plugin_works_here"
        assert "scores this completion 0 on the coordinator" in reply.json()["message"]
        after = served.snapshot()
        assert after.pop("nonces") != before.pop("nonces")  # answered (so not to be replayed), and nothing else
        assert after == before
        flag.touch()

        # A real node: the reward raises in its finisher process; the node says so, gives each task back, goes on.
        client = NodeClient(served.url, Account.create(), NodeSettings(state_dir=tmp_path / "node"))
        client.register(probe(tmp_path / "node"), None)
        out, finishers = io.StringIO(), finisher_pool()
        try:
            loop = WorkLoop(client, Console(file=out, width=400), threading.Event(), idle_wait=0.1, finishers=finishers)
            assert loop.run(max_tasks=2) == 0 and loop.failure is None
        finally:
            stop_finishers(finishers)
            client.close()
        said = out.getvalue()
        assert said.count("given back: environment 'buggy' (intellect-buggy==0.2.0) failed on problem ") == 2, said
        assert "its reward raised KeyError: 'answer'" in said and "the task is back in the pool" in said, said
        assert "Traceback" not in said
        info = HTTP.get(f"{served.url}/v1/public/runs/{run_id}").json()
        # Past the count, but from one node of three: that node may have found a text the reward crashes on.
        assert info["status"] == "active" and info["plugin_failures"] == 2

        def report(reporter, task) -> httpx.Response:
            body = PluginFailureReport(
                address=reporter.address, task_id=task.task_id, problem_id=task.prompt_ids[0], completion="7"
            )
            return signed_post(served.url, "/v1/tasks/plugin-failure", reporter, served.audience, body.model_dump())

        assert report(node, held).json()["failures"] == 3 and report(node, lease(served, node)).json()["paused"] is False
        assert report(other, lease(served, other)).json()["paused"] is True  # a third node: the bug is the plugin's
        info = HTTP.get(f"{served.url}/v1/public/runs/{run_id}").json()
        assert info["status"] == "paused" and info["plugin_failures"] == 5
        assert "after 5 reward failures of its environment on 3 nodes" in info["paused_reason"]
        assert "intellect-buggy==0.2.0" in info["paused_reason"]
        assert "KeyError: 'answer'" in info["paused_reason"]
        work = HTTP.get(f"{served.url}/v1/public/network").json()["work"]  # what nodes are told, and the page shows
        assert work["reason"] == "paused" and info["paused_reason"] in work["message"]
        # Resumed by an operator: the count starts again and the reason is gone.
        token = admin_token(served)
        reply = HTTP.post(f"{served.url}/v1/admin/runs/{run_id}/resume", headers={"authorization": f"Bearer {token}"})
        assert reply.status_code == 200 and reply.json()["paused_reason"] is None and reply.json()["plugin_failures"] == 0


def test_the_only_node_of_a_network_can_pause_its_run(flag: Path, sqlite_url: str, tmp_path: Path) -> None:
    settings = CoordinatorSettings(database_url=sqlite_url, blob_dir=tmp_path / "blobs", plugin_failures_to_pause=1)
    with serve(settings) as served:
        run_id = make_run(served, environment="buggy", sampling=SamplingParams(max_tokens=4), prompts=1, samples=2)
        node = joined(served)
        task = lease(served, node)
        body = PluginFailureReport(address=node.address, task_id=task.task_id, problem_id=task.prompt_ids[0], completion="7")
        reply = signed_post(served.url, "/v1/tasks/plugin-failure", node, served.audience, body.model_dump())
        assert reply.status_code == 200 and reply.json()["paused"] is True, reply.text
        assert HTTP.get(f"{served.url}/v1/public/runs/{run_id}").json()["status"] == "paused"


def test_a_validator_whose_reward_fails_posts_no_verdict(flag: Path, sqlite_url: str, tmp_path: Path) -> None:
    settings = CoordinatorSettings(
        database_url=sqlite_url,
        blob_dir=tmp_path / "blobs",
        **LIFTED,
    )
    with serve(settings) as served:
        make_run(
            served,
            environment="buggy",
            sampling=SamplingParams(max_tokens=4),
            audit=AuditPolicy(share=0, new_node_share=0, suspect_share=0),
        )
        node = joined(served)
        task = lease(served, node)
        flag.unlink()
        generated = generate(task)
        submission = upload(served, node, task, finish(generated).data)  # scored by the node's working reward
        flag.touch()
        with pytest.raises(PluginFailure):
            finish(generated)
        key = Account.create()
        grant(served, admin_token(served), key.address, "validator")
        out = io.StringIO()
        validator = Validator(served.url, key, tmp_path / "validator", Console(file=out, width=400))
        worker = threading.Thread(target=validator.run, daemon=True)
        worker.start()
        deadline = time.monotonic() + 120
        while "skipped, no verdict" not in out.getvalue() and time.monotonic() < deadline:
            time.sleep(0.2)
        validator.stop.set()
        worker.join(30)
        validator.close()
        assert "failed on problem" in out.getvalue() and "skipped, no verdict" in out.getvalue(), out.getvalue()
        receipt = HTTP.get(f"{served.url}/v1/public/submissions/{submission}").json()
        assert receipt["status"] == "pending" and receipt["verdicts"] == []
        assert HTTP.get(f"{served.url}/v1/public/nodes/{node.address}").json()["status"] == "registered"
        with served.engine.connect() as connection:
            assert connection.execute(text("SELECT strikes FROM nodes WHERE address = :a"), {"a": node.address}).scalar() == 0
