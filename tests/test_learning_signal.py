"""A run that cannot learn says so: every group of its accepted work without a reward spread (a model that never
solves the task), the coordinator's progress, read by the page and the devnet, says it in one sentence with the
figures and what to do, once enough groups have come in for a minute (the coordinator's own clock)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from eth_account import Account
from rich.console import Console
from transformers import AutoModelForCausalLM

from intellect_protocol.coordinator.services.learning_signal import MIN_GROUPS, PATIENCE_S, file_signal
from intellect_protocol.coordinator.settings import CoordinatorSettings
from intellect_protocol.node.work import finish, generate
from intellect_protocol.shared.models import load_model
from intellect_protocol.shared.rollout_file import read_rollouts
from intellect_protocol.shared.run_schemas import RunProgress
from intellect_protocol.shared.schemas import SamplingParams
from intellect_protocol.trainer.data import Batch, NoSignalWatch, add_submission
from intellect_protocol.validator.worker import Validator
from tests.conftest import LIFTED, admin_token, serve
from tests.helpers import HTTP, make_run
from tests.support.checks import honest, make_task
from tests.support.clock import MovableClock
from tests.support.protocol import grant, joined, lease, upload


@pytest.mark.unit
def test_a_files_groups_without_a_reward_spread_are_counted() -> None:
    task = make_task(1, prompts=2, samples=2, max_tokens=8)
    rollouts = read_rollouts(honest(task))
    for r in rollouts[: task.samples_per_prompt]:
        r.task_reward = 1.0  # the first prompt's samples agree
    for r, reward in zip(rollouts[task.samples_per_prompt :], (0.0, 1.0), strict=True):
        r.task_reward = reward  # the second's differ
    signal = file_signal(rollouts)
    assert signal["groups"] == len(task.prompt_ids) == 2 and signal["flat_groups"] == 1
    assert signal["task_reward_sum"] == pytest.approx(sum(r.task_reward for r in rollouts))


@pytest.mark.unit
def test_a_trainer_reading_only_groups_without_a_spread_says_so_once_after_a_minute(caplog) -> None:
    task = make_task(2, prompts=2, samples=2, max_tokens=8)
    rollouts = read_rollouts(honest(task))
    for r in rollouts:
        r.task_reward = 0.0
    now = [0.0]
    watch, batch = NoSignalWatch(step=3, clock=lambda: now[0]), Batch()
    add_submission(batch, rollouts, oldest_step=0)
    assert batch.flat == 2 and not batch.groups
    with caplog.at_level(logging.WARNING, logger="intellect.trainer"):
        watch.check(batch)
        assert not caplog.records  # not a minute yet
        now[0] = 61.0
        watch.check(batch)
        watch.check(batch)
    [said] = [r.getMessage() for r in caplog.records]
    assert said.startswith(
        "No learning signal: 2 groups read for policy step 4, none with a reward spread (mean task reward 0.00)"
    )


def test_a_run_whose_model_never_earns_a_reward_says_it_cannot_learn(sqlite_url: str, tmp_path: Path) -> None:
    # A random model of the tiny one's shape: it answers no arithmetic problem.
    tiny, tokenizer = load_model()
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(tiny.config).save_pretrained(tmp_path / "random")
    tokenizer.save_pretrained(tmp_path / "random")
    settings = CoordinatorSettings(
        database_url=sqlite_url,
        blob_dir=tmp_path / "blobs",
        **LIFTED,
    )
    clock = MovableClock()
    with serve(settings, clock=clock) as served:
        run_id = make_run(served, sampling=SamplingParams(max_tokens=6), prompts=4, samples=4, model=str(tmp_path / "random"))
        validator_key = Account.create()
        grant(served, admin_token(served), validator_key.address, "validator")
        node = joined(served)
        files = MIN_GROUPS // 4
        for _ in range(files):
            task = lease(served, node)
            upload(served, node, task, finish(generate(task)).data)
        validator = Validator(served.url, validator_key, tmp_path / "validator", Console(quiet=True), batch=files)
        assert validator.run(max_submissions=files) == files
        validator.close()

        def progress() -> RunProgress:
            return RunProgress.model_validate(HTTP.get(f"{served.url}/v1/public/runs/{run_id}/progress").json())

        learning = progress().learning
        assert learning is not None and learning.groups == learning.flat_groups == MIN_GROUPS
        assert learning.task_reward_mean == 0.0 and learning.stalled is None  # not a minute yet
        clock.advance(PATIENCE_S + 1)
        stalled = progress().learning.stalled
        assert stalled is not None and stalled.startswith(f"No learning signal: {MIN_GROUPS} groups accepted since policy step 0")
        assert "mean task reward 0.00" in stalled and "partial credit" in stalled and "--steps 0" in stalled
        # The network's status says it too, beside its work status: work still goes out, and teaches nothing.
        assert HTTP.get(f"{served.url}/v1/public/network").json()["learning_stalled"] == stalled
