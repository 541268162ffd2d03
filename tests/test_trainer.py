"""The trainer against a real coordinator: it reads accepted rollouts exactly once through its
cursor (across a restart too), drops stale and flat groups, publishes each step as a signed
manifest the coordinator accepts, and posts metrics. Nodes here speak the API by hand with
the node's own code; the validator is the real one."""

from __future__ import annotations

import dataclasses
import io
import threading
import time
from pathlib import Path

import torch
from eth_account import Account
from rich.console import Console
from sqlalchemy import select

from intellect_protocol.coordinator.db import make_sessionmaker
from intellect_protocol.coordinator.models import Run, Submission, TrainerMetrics
from intellect_protocol.coordinator.settings import CoordinatorSettings
from intellect_protocol.devnet.processes import start_relay
from intellect_protocol.node.work import finish, generate
from intellect_protocol.shared.rollout_file import read_rollouts
from intellect_protocol.shared.schemas import SamplingParams
from intellect_protocol.shared.shardcast.origin import step_dir
from intellect_protocol.shared.states import SubmissionStatus
from intellect_protocol.shared.wallet import THROWAWAY_SCRYPT_N, create_wallet
from intellect_protocol.trainer.data import Batch, Group
from intellect_protocol.trainer.loop import Trainer
from intellect_protocol.trainer.settings import TrainerSettings
from intellect_protocol.validator.worker import Validator
from tests.conftest import LIFTED, admin_token, serve
from tests.helpers import HTTP, make_run
from tests.support.protocol import grant, joined, lease, upload


def test_trainer_uses_each_accepted_rollout_once_and_publishes_steps(sqlite_url: str, tmp_path: Path) -> None:
    settings = CoordinatorSettings(
        database_url=sqlite_url,
        blob_dir=tmp_path / "blobs",
        **LIFTED,
    )
    with serve(settings) as served:
        run_id = make_run(served, sampling=SamplingParams(temperature=1.0, max_tokens=48), prompts=2, samples=4)
        token = admin_token(served)
        trainer_key, validator_key = Account.create(), Account.create()
        grant(served, token, trainer_key.address, "trainer")
        grant(served, token, validator_key.address, "validator")
        said = io.StringIO()
        validator = Validator(served.url, validator_key, tmp_path / "validator", Console(file=said, width=300), batch=16)
        origin = tmp_path / "origin"
        origin_wallet = tmp_path / "origin.json"
        grant(served, token, create_wallet(origin_wallet, "pw", scrypt_n=THROWAWAY_SCRYPT_N), "relay")
        origin_server = start_relay(
            tmp_path, "origin", origin_wallet, "pw", served.url, origin=True
        )  # the validator fetches steps from it

        try:

            def produce(count: int) -> None:
                """Nodes generate with the policy step their task names (read from the origin's directory) and the validator checks."""
                node = joined(served)
                for _ in range(count):
                    task = lease(served, node)
                    model = str(step_dir(origin, run_id, task.policy_step)) if task.policy_step else task.model
                    upload(served, node, task, finish(generate(task.model_copy(update={"model": model}))).data)
                validator.run(max_submissions=validator.checked + count)

            used: list[tuple[str, str]] = []
            steps: list[tuple[int, dict]] = []
            threads: list[int] = []

            def on_step(step: int, metrics: dict, batch) -> None:
                used.extend(g.key for g in batch.groups)
                steps.append((step, metrics))
                threads.append(torch.get_num_threads())

            config = TrainerSettings(groups_per_step=3, chunk_size=1 << 20)
            produce(8)  # 16 groups: a step needs 3 with reward variance; 8 groups held as few as 3 (measured)
            trainer = Trainer(served.url, trainer_key, run_id, origin, tmp_path / "ckpt", config)
            assert trainer.run(threading.Event(), steps=1, on_step=on_step) == 1
            trainer.close()

            # A new trainer process resumes from the checkpoint: step 1's model, the cursor, the optimizer.
            produce(8)
            # ... on as many torch threads as its operator asks (unset: torch's own choice, left as it is).
            before = torch.get_num_threads()
            resumed = Trainer(
                served.url, trainer_key, run_id, origin, tmp_path / "ckpt", config.model_copy(update={"threads": 2})
            )
            assert resumed.state.step == 1 and resumed.state.cursor > 0
            try:
                assert resumed.run(threading.Event(), steps=2, on_step=on_step) == 2
            finally:
                torch.set_num_threads(before)
            resumed.close()
            assert threads == [before, before + 1]

            # With the origin gone, step 2 is on no relay: the validator skips its file, unjudged, and checks on.
            origin_server.stop()
            node = joined(served)
            task = lease(served, node)
            model = str(step_dir(origin, run_id, task.policy_step))
            unjudged = upload(served, node, task, finish(generate(task.model_copy(update={"model": model}))).data)
            checking = threading.Thread(target=validator.run)
            checking.start()
            deadline = time.monotonic() + 120
            while "could not be fetched" not in said.getvalue() and time.monotonic() < deadline and checking.is_alive():
                time.sleep(0.1)
            validator.stop.set()
            checking.join(60)
            assert not checking.is_alive() and "policy step 2 could not be fetched" in said.getvalue()
            validator.close()
        finally:
            origin_server.stop()

        assert len(used) == len(set(used)), "a group was trained on twice"
        with make_sessionmaker(served.engine)() as session:
            assert session.get_one(Run, run_id).policy_step == 2
            assert session.get_one(Submission, unjudged).status == SubmissionStatus.pending
            posted = {m.step: m.metrics for m in session.scalars(select(TrainerMetrics))}
        assert sorted(posted) == [1, 2]
        for step, metrics in steps:
            assert posted[step]["groups"] >= 3 and set(metrics) >= {
                "loss",
                "entropy",
                "clip_low",
                "clip_high",
                "grad_norm",
                "staleness",
            }
        latest = HTTP.get(f"{served.url}/v1/manifests/{run_id}/latest").json()
        assert latest["step"] == 2 and latest["signed"]["signer"] == trainer_key.address
        assert (step_dir(origin, run_id, 2) / "model.safetensors").exists()


def test_a_step_whose_gradient_is_not_finite_is_skipped_and_counted(sqlite_url: str, tmp_path: Path) -> None:
    settings = CoordinatorSettings(database_url=sqlite_url, blob_dir=tmp_path / "blobs")
    with serve(settings) as served:
        run_id = make_run(served, sampling=SamplingParams(temperature=1.0, max_tokens=48), prompts=1, samples=4)
        trainer = Trainer(
            served.url, Account.create(), run_id, tmp_path / "origin", tmp_path / "ckpt", TrainerSettings(optimizer_steps=2)
        )
        node = joined(served)
        task = lease(served, node)
        rollouts = read_rollouts(finish(generate(task)).data)
        for r, reward_value in zip(rollouts, (1.0, 0.0, 1.0, 0.0)):
            r.reward = r.task_reward = reward_value
        before = [p.detach().clone() for p in trainer.model.parameters()]

        poisoned = [dataclasses.replace(r) for r in rollouts]
        poisoned[1].logprobs = [*poisoned[1].logprobs[:-1], poisoned[1].logprobs[-1] - 89.0]  # finite in the file, inf as a ratio
        metrics = trainer.train_step(Batch(groups=[Group((task.task_id, rollouts[0].prompt_id), poisoned)]))
        assert metrics["skipped_nonfinite"] == 2
        assert all(torch.equal(a, b) for a, b in zip(before, trainer.model.parameters()))

        metrics = trainer.train_step(Batch(groups=[Group((task.task_id, rollouts[0].prompt_id), rollouts)]))
        assert metrics["skipped_nonfinite"] == 0
        assert not all(torch.equal(a, b) for a, b in zip(before, trainer.model.parameters()))
        assert all(torch.isfinite(p).all() for p in trainer.model.parameters())
        trainer.close()
