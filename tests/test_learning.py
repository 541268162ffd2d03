"""The network learns: real processes on loopback (coordinator, shardcast origin and relay,
validator, trainer, a node) and the tiny model's held-out greedy accuracy rises over a few
policy steps of validated GRPO."""

from __future__ import annotations

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
