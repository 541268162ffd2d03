"""A real `intellect-node join` subprocess completes tasks of an arithmetic run; the stored
rollout files parse, their rewards recompute, and their proofs verify against a prefill."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path

import torch
from sqlalchemy import select

from intellect_protocol.coordinator.db import make_sessionmaker
from intellect_protocol.coordinator.models import Submission
from intellect_protocol.coordinator.services.runs import create_run
from intellect_protocol.coordinator.settings import CoordinatorSettings
from intellect_protocol.devnet.chaos import wait_until
from intellect_protocol.devnet.processes import start_node
from intellect_protocol.shared.environments.arithmetic import reward as arithmetic_reward
from intellect_protocol.shared.environments.registry import get_environment
from intellect_protocol.shared.inference import prefill
from intellect_protocol.shared.models import load_model
from intellect_protocol.shared.rollout_file import read_rollouts
from intellect_protocol.shared.run_schemas import RunSpec
from intellect_protocol.shared.sampling import replay
from intellect_protocol.shared.toploc import rollout_passes, verify_proofs
from intellect_protocol.shared.wallet import THROWAWAY_SCRYPT_N, create_wallet
from tests.conftest import FAST, serve
from tests.helpers import HTTP, descendants, make_run, private_mib


def test_node_completes_arithmetic_tasks(sqlite_url: str, tmp_path: Path) -> None:
    settings = CoordinatorSettings(database_url=sqlite_url, blob_dir=tmp_path / "blobs", **FAST)
    with serve(settings) as c:
        sessions = make_sessionmaker(c.engine)
        wallet = tmp_path / "node.json"
        create_wallet(wallet, "pw", scrypt_n=THROWAWAY_SCRYPT_N)
        node = start_node(tmp_path, "node-1", wallet, c.url, "pw")
        try:
            # Started before any run: it waits without loading the model code, and starts when a run does. Its
            # finisher is forked and idle: loaded, it would hold 70 MiB of its own here (300 MiB spawned).
            wait_until(lambda: "No active run" in node.tail(), 60, "the node to wait for a run")
            (finisher,) = descendants(node.popen.pid)
            assert private_mib(finisher) < 16
            with sessions.begin() as session:
                create_run(session, RunSpec(name="arith", prompts_per_task=2), datetime.now(UTC))
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                with sessions() as session:
                    submissions = list(session.scalars(select(Submission)))
                if len(submissions) >= 2:
                    break
                assert node.popen.poll() is None, node.tail()
                time.sleep(0.5)
            assert len(submissions) >= 2, node.tail()
        finally:
            assert node.stop() == 0
        log = node.tail(100)
        assert "Ready for work." in log and log.index("Ready for work.") < log.index("Task 1"), log

    model, tokenizer = load_model("tiny-arith")
    problems = {p.id: p for p in get_environment("arithmetic").problems()}
    for submission in submissions[:2]:
        assert submission.status == "pending" and submission.rows == 8
        rollouts = read_rollouts((settings.blob_dir / submission.blob_key).read_bytes())
        for r in rollouts:
            text = tokenizer.decode(r.completion_tokens, skip_special_tokens=True)
            assert r.task_reward == arithmetic_reward(text, int(problems[r.prompt_id].answer))
            hidden, logits = prefill(model, r.prompt_tokens, r.completion_tokens)
            assert rollout_passes(verify_proofs(hidden, r.proofs))
            assert replay(logits, r.seed, 1.0).tolist() == r.completion_tokens
            assert torch.allclose(
                logits.log_softmax(-1).gather(-1, torch.tensor(r.completion_tokens)[:, None])[:, 0],
                torch.tensor(r.logprobs),
                atol=1e-4,
            )


def test_a_killed_node_leaves_no_process_behind(sqlite_url: str, tmp_path: Path) -> None:
    settings = CoordinatorSettings(database_url=sqlite_url, blob_dir=tmp_path / "blobs", **FAST)
    with serve(settings) as c:
        make_run(c)
        wallet = tmp_path / "node.json"
        create_wallet(wallet, "pw", scrypt_n=THROWAWAY_SCRYPT_N)
        node = start_node(tmp_path, "node-1", wallet, c.url, "pw")
        deadline = time.monotonic() + 120
        while "Task 1 " not in node.tail(100):  # its finisher process has started and done work
            assert time.monotonic() < deadline and node.popen.poll() is None, node.tail()
            time.sleep(0.2)
        helpers = descendants(node.popen.pid)
        assert helpers
        node.kill()
        deadline = time.monotonic() + 10
        while any(Path(f"/proc/{p}").exists() for p in helpers) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not [p for p in helpers if Path(f"/proc/{p}").exists()], "the node's helper processes outlived it"


def test_node_rides_out_a_coordinator_restart(tmp_path: Path, sqlite_url: str) -> None:
    from intellect_protocol.coordinator.db import make_engine
    from intellect_protocol.devnet.processes import create_run as create_run_cli
    from intellect_protocol.devnet.processes import free_port, start_coordinator

    url = sqlite_url
    create_run_cli(url, "arith", tmp_path / "logs" / "run.log")
    env = {"INTELLECT_BLOB_DIR": str(tmp_path / "blobs"), "INTELLECT_HEARTBEAT_INTERVAL_S": "0.5"}
    port = free_port()
    engine = make_engine(url)

    def submitted() -> int:
        with engine.connect() as connection:
            return len(connection.execute(select(Submission.id)).all())

    def wait_for(count: int, node) -> None:
        deadline = time.monotonic() + 120
        while submitted() < count:
            assert time.monotonic() < deadline and node.popen.poll() is None, node.tail()
            time.sleep(0.3)

    coordinator = start_coordinator(tmp_path, url, port=port, env=env)
    create_wallet(tmp_path / "node.json", "pw", scrypt_n=THROWAWAY_SCRYPT_N)
    node = start_node(tmp_path, "node-1", tmp_path / "node.json", coordinator.url, "pw")
    try:
        wait_for(1, node)
        coordinator.kill()
        time.sleep(2)
        assert node.popen.poll() is None
        before = submitted()
        coordinator = start_coordinator(tmp_path, url, port=port, env=env)
        wait_for(before + 2, node)
        assert "Cannot reach the coordinator" in node.tail(200)
    finally:
        node.stop()
        coordinator.stop()
        engine.dispose()


def test_a_node_banned_while_working_stops_and_says_why(sqlite_url: str, tmp_path: Path) -> None:
    """Whichever of the node's threads meets the ban first (lease, upload or heartbeat), the node
    exits with the ban's code and reason, never silently with 0."""

    from tests.conftest import admin_token

    # A slow heartbeat, so the ban is usually met by the lease or the upload thread first.
    settings = CoordinatorSettings(database_url=sqlite_url, blob_dir=tmp_path / "blobs", heartbeat_interval_s=60)
    with serve(settings) as c:
        sessions = make_sessionmaker(c.engine)
        with sessions.begin() as session:
            create_run(session, RunSpec(name="arith", prompts_per_task=2), datetime.now(UTC))
        wallet = tmp_path / "node.json"
        address = create_wallet(wallet, "pw", scrypt_n=THROWAWAY_SCRYPT_N)
        node = start_node(tmp_path, "node-1", wallet, c.url, "pw")
        try:
            deadline = time.monotonic() + 120
            while "Task 1 " not in node.tail(100):
                assert time.monotonic() < deadline and node.popen.poll() is None, node.tail()
                time.sleep(0.2)
            ban = HTTP.post(
                f"{c.url}/v1/admin/nodes/{address}/ban",
                json={"reason": "caught forging proofs"},
                headers={"authorization": f"Bearer {admin_token(c)}"},
            )
            assert ban.status_code == 200, ban.text
            assert node.popen.wait(90) == 3, node.tail()
            assert "banned by the coordinator's operator: caught forging proofs" in node.tail()
        finally:
            node.stop()
