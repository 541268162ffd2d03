"""The network learns: real processes on loopback (coordinator, shardcast origin and relay,
validator, trainer, a node) and the tiny model's held-out greedy accuracy rises over a few
policy steps of validated GRPO."""

from __future__ import annotations

import random
import time
from pathlib import Path

import httpx
import pytest
import torch

from intellect_protocol.devnet.network import start_network
from intellect_protocol.shared.models import load_model
from intellect_protocol.shared.shardcast.origin import step_dir
from intellect_protocol.shared.tiny_model import greedy_accuracy, held_out

pytestmark = pytest.mark.e2e

STEPS = 6


def test_accuracy_rises_over_policy_steps(tmp_path: Path) -> None:
    net = start_network(
        tmp_path,
        nodes=1,
        run_options=["--prompts-per-task", "4", "--samples-per-prompt", "8", "--max-tokens", "64"],
        coordinator_env={"INTELLECT_HEARTBEAT_INTERVAL_S": "2"},
        steps=STEPS,
    )
    try:
        deadline = time.monotonic() + 900
        while True:
            reply = httpx.get(f"{net.coordinator.url}/v1/manifests/{net.run_id}/latest")
            if reply.status_code == 200 and reply.json()["step"] >= STEPS:
                break
            for process in net.processes:
                assert process.popen.poll() is None, f"{process.name} exited:\n{process.tail()}"
            assert time.monotonic() < deadline, net.by_name("trainer").tail()
            time.sleep(2)
        assert net.by_name("trainer").popen.wait(60) == 0
    finally:
        codes = net.stop()
    assert all(code == 0 for name, code in codes.items() if name != "trainer"), codes

    torch.set_num_threads(1)
    problems = held_out()
    base, tokenizer = load_model("tiny-arith")
    trained, _ = load_model(step_dir(tmp_path / "origin", net.run_id, STEPS))
    before, after = greedy_accuracy(base, tokenizer, problems), greedy_accuracy(trained, tokenizer, problems)
    assert after >= before + 0.03, f"held-out accuracy {before:.3f} -> {after:.3f}"


def test_a_trainer_killed_mid_run_resumes_without_losing_or_reusing_rollouts(tmp_path: Path) -> None:
    from sqlalchemy import create_engine, select

    from intellect_protocol.coordinator.models import ContributionEntry, Submission
    from intellect_protocol.devnet.processes import spawn
    from intellect_protocol.trainer.loop import CHECKPOINT

    net = start_network(
        tmp_path, nodes=1, run_options=["--prompts-per-task", "4", "--samples-per-prompt", "4", "--max-tokens", "48"], steps=5
    )

    def published() -> int:
        reply = httpx.get(f"{net.coordinator.url}/v1/manifests/{net.run_id}/latest")
        return reply.json()["step"] if reply.status_code == 200 else 0

    def wait_for(step: int) -> None:
        deadline = time.monotonic() + 600
        while published() < step:
            assert time.monotonic() < deadline, net.by_name("trainer").tail()
            time.sleep(0.2)

    try:
        wait_for(2)
        trainer = net.by_name("trainer")
        time.sleep(random.Random(0).uniform(0.2, 2.0))  # somewhere inside the next step
        trainer.kill()
        restarted = spawn(
            "trainer",
            trainer.popen.args,
            tmp_path / "logs" / "trainer-restarted.log",
            {"INTELLECT_WALLET_PASSWORD": net.password},
        )  # type: ignore[arg-type]
        net.processes.append(restarted)
        wait_for(5)
        assert restarted.popen.wait(120) == 0, restarted.tail()
    finally:
        net.stop()

    state = torch.load(tmp_path / "trainer" / CHECKPOINT, weights_only=False)["state"]
    ranges = state["consumed"]
    assert [step for step, _, _ in ranges] == [1, 2, 3, 4, 5]
    assert ranges[0][1] == 0 and all(a[2] == b[1] for a, b in zip(ranges, ranges[1:])), (
        ranges
    )  # contiguous: nothing skipped or reread
    engine = create_engine(net.database_url)
    with engine.connect() as connection:
        accepted = [
            c
            for (c,) in connection.execute(
                select(ContributionEntry.id).join(Submission).where(ContributionEntry.kind == "credit")
            )
        ]
    engine.dispose()
    assert state["cursor"] == ranges[-1][2] <= max(accepted)  # the cursor names a real ledger entry
    # Every step read accepted rollouts of its own, none ran on an empty or made-up range.
    assert all(any(after < c <= cursor for c in accepted) for _, after, cursor in ranges), (ranges, accepted)
