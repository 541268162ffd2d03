"""The baseline of ``bench/learning.py``: one process generates, scores and trains, on-policy.

Nothing of the protocol: no coordinator, validator, relay, proofs or signatures. What is the
network's is used as it is, so only the protocol differs: the run's settings come from a run
made by ``intellect-coordinator run create`` with the same flags (read from its ledger), tasks
are cut and seeded as the coordinator cuts them (:func:`coordinator.services.runs.spec`),
completions come from the node's torch backend and are scored by the node's code, and groups
are batched and learned from by the trainer's :class:`trainer.learner.Learner`.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import torch
from _cpu import TOTAL
from sqlalchemy import select

from intellect_protocol.coordinator.db import make_engine, make_sessionmaker
from intellect_protocol.coordinator.models import Run, Task
from intellect_protocol.coordinator.services.runs import problem_ids, spec, task_params
from intellect_protocol.devnet.processes import create_run, migrate
from intellect_protocol.node.work import generate_with, rewards_for, score
from intellect_protocol.shared import cpu_ledger
from intellect_protocol.shared.models import load_model
from intellect_protocol.shared.schemas import TaskSpec
from intellect_protocol.shared.torch_backend import TorchBackend
from intellect_protocol.trainer.data import Batch, add_submission
from intellect_protocol.trainer.distributed import placement
from intellect_protocol.trainer.learner import Learner
from intellect_protocol.trainer.settings import TrainerSettings

Snapshot = tuple[float, int, dict[str, torch.Tensor]]
"""(seconds since start, policy step, the weights)."""
Metrics = dict[str, float]


def tasks(workdir: Path, run_options: list[str]) -> Iterator[TaskSpec]:
    """Endless tasks of a run created with ``run_options``; set ``policy_step`` on each as it is used."""
    database_url = f"sqlite:///{workdir / 'ledger.db'}"
    migrate(database_url, workdir / "migrate.log")
    run_id = create_run(database_url, "single-process", workdir / "run.log", run_options)
    with make_sessionmaker(make_engine(database_url))() as session:
        run = session.scalar(select(Run).where(Run.id == run_id))
        assert run is not None
        session.expunge(run)
    ids = problem_ids(run.environment, run.environment_version)
    cursor = 0
    while True:
        chosen = [ids[(cursor + i) % len(ids)] for i in range(run.prompts_per_task)]
        cursor = (cursor + run.prompts_per_task) % len(ids)
        task = Task(
            id=f"task-{secrets.token_hex(16)}",
            run_id=run.id,
            prompt_ids={"ids": chosen},
            seed=secrets.randbits(62),
            policy_step=0,
            lease_expires_at=datetime.now(UTC),
            params=task_params(run),
        )
        yield spec(run, task)


def learn(
    workdir: Path, run_options: list[str], seconds: float, threads: int, settings: TrainerSettings
) -> tuple[list[Snapshot], list[Metrics], int, dict[str, float]]:
    """Generate, score and train in turn for ``seconds``; the weights after every policy step, its
    metrics, how many rollouts were generated, and the :mod:`shared.cpu_ledger` seconds spent in those
    ``seconds`` by activity, with the process's whole time as ``total`` (when recording)."""
    source = tasks(workdir, run_options)
    first = next(source)
    model, tokenizer = load_model(first.model)
    backend = TorchBackend(model, tokenizer.eos_token_id, tokenizer.pad_token_id, threads=threads)
    learner = Learner(model, settings, first.sampling.temperature, placement())
    rewards_for(first.environment, first.environment_version).start()  # as a network's node is ready before its clock
    before, started = cpu_ledger.snapshot(), time.perf_counter()
    snapshots: list[Snapshot] = [(0.0, 0, _copy(model))]
    metrics: list[Metrics] = []
    step = generated = 0
    while time.perf_counter() - started < seconds:
        batch = Batch()
        while len(batch.groups) < settings.groups_per_step:
            task = next(source).model_copy(update={"policy_step": step})
            rollouts = score(generate_with(backend, tokenizer, task), [b""] * len(task.prompt_ids) * task.samples_per_prompt)
            add_submission(batch, rollouts, step, online_filter=settings.online_filter)
            generated += len(rollouts)
        model.train()  # as the trainer learns (generation is under inference mode either way)
        metrics.append(learner.step(batch, step))
        model.eval()
        step += 1
        snapshots.append((time.perf_counter() - started, step, _copy(model)))
    after = cpu_ledger.snapshot()
    spent = {a: s - before.activities.get(a, 0.0) for a, s in after.activities.items()}
    return snapshots, metrics, generated, spent | {TOTAL: after.cpu_s - before.cpu_s}


def _copy(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}
