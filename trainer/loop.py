"""The trainer's loop: accepted rollouts in, a GRPO update, policy step N + 1 out.

Per policy version: read accepted submissions after the cursor until ``groups_per_step``
groups with a learning signal are in hand (stale and flat groups dropped and counted), take
``optimizer_steps`` AdamW steps on the token-level GRPO loss against the logprobs the nodes
recorded, write the model into the origin's directory, save the checkpoint (step, cursor,
optimizer, the signed manifest), then register the manifest with the coordinator and post the
step's metrics.

The checkpoint is written before the manifest is registered, so a trainer killed at any
moment restarts at a consistent (step, cursor): no accepted rollout is used twice or lost,
and a step whose manifest was not registered yet is registered on restart.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from eth_account.signers.local import LocalAccount
from pydantic import BaseModel

from intellect_protocol.shared.coordinator_client import CoordinatorClient, Refused
from intellect_protocol.shared.cpu_ledger import spent
from intellect_protocol.shared.environments.registry import Problem, get_environment
from intellect_protocol.shared.files import write_atomic_with
from intellect_protocol.shared.models import load_model
from intellect_protocol.shared.run_schemas import oldest_usable_step
from intellect_protocol.shared.schemas import ErrorCode, TrainerMetricsRequest
from intellect_protocol.shared.shardcast.manifest import SignedManifest
from intellect_protocol.shared.shardcast.origin import publish_step, step_dir
from intellect_protocol.trainer.data import Batch, NoSignalWatch, add_submission, fetch_accepted
from intellect_protocol.trainer.distributed import full_state_dict, placement
from intellect_protocol.trainer.learner import Abandoned, Learner
from intellect_protocol.trainer.settings import TrainerSettings

log = logging.getLogger("intellect.trainer")
CHECKPOINT = "trainer-state.pt"


StepHook = Callable[[int, dict[str, float], Any], None]
"""Called after each published policy step with the step, its metrics and what it learned from (a
:class:`Batch`, or an island's outer step)."""


class Checkpoint(BaseModel):
    step: int
    cursor: int
    optimizer_steps: int
    manifest: str | None = None
    """The signed manifest of ``step`` (JSON), registered again on restart if need be."""
    consumed: list[tuple[int, int, int]] = []
    """(step, cursor before, cursor after) per policy step: the ranges must tile the cursor line."""


class Trainer:
    def __init__(
        self,
        coordinator: str,
        account: LocalAccount,
        run_id: str,
        origin_dir: Path,
        checkpoint_dir: Path,
        settings: TrainerSettings | None = None,
        stop: threading.Event | None = None,
    ) -> None:
        """Requests to an unreachable or overloaded coordinator are retried until ``stop``."""
        self.settings = settings or TrainerSettings()
        self.account = account
        self.run_id = run_id
        self.origin_dir = origin_dir
        self.checkpoint_dir = checkpoint_dir
        checkpoint_dir.mkdir(parents=True, exist_ok=True)
        self.api = CoordinatorClient(coordinator, account, stop=stop)
        self.run_info = self.api.run_info(run_id)

        path = checkpoint_dir / CHECKPOINT
        saved = torch.load(path, weights_only=True) if path.exists() else None
        self.state = Checkpoint.model_validate(saved["state"]) if saved else Checkpoint(step=0, cursor=0, optimizer_steps=0)
        source = str(step_dir(origin_dir, run_id, self.state.step)) if self.state.step > 0 else self.run_info.model
        self.model, self.tokenizer = load_model(source)
        self.model.train()
        if self.settings.gradient_checkpointing:
            self.model.gradient_checkpointing_enable()
        self.problems = self._problems()
        self.where = placement()
        temperature = self.run_info.sampling.temperature  # node logprobs are of logits / T: the ratio must use the same T
        self.learner = Learner(self.model, self.learner_settings(), temperature, self.where, self.state.optimizer_steps)
        if saved:
            self.learner.optimizer.load_state_dict(saved["optimizer"])
        if self.state.manifest is not None and self.where.leader:
            self._register(SignedManifest.model_validate_json(self.state.manifest))

    def _problems(self) -> dict[str, Problem]:
        """The run's problems by id (their pass rates filter the groups trained on)."""
        return {p.id: p for p in get_environment(self.run_info.environment, self.run_info.environment_version).problems()}

    def learner_settings(self) -> TrainerSettings:
        """The settings the learner's optimizer takes."""
        return self.settings

    @property
    def step(self) -> int:
        """The policy step this trainer's weights are."""
        return self.state.step

    def close(self) -> None:
        self.api.close()

    def collect(self, stop: threading.Event) -> Batch | None:
        """Groups for the next policy version, or None if ``stop`` came first."""
        # Step N + 1 learns from the current policy N and at most async_level steps older (0: on-policy only).
        oldest = oldest_usable_step(self.state.step, self.run_info.async_level)
        batch = Batch(cursor=self.state.cursor)
        watch = NoSignalWatch(self.state.step)
        while len(batch.groups) < self.settings.groups_per_step:
            entries = fetch_accepted(self.api, self.run_id, batch.cursor, oldest, wait_s=self.settings.accepted_wait_s)
            if not entries:
                if stop.is_set():
                    return None
                continue
            for entry, rollouts in entries:
                add_submission(batch, rollouts, oldest, self._in_pass_range, self.settings.online_filter)
                batch.untrained += len(entry.untrained_rows) if rollouts is not None else 0
                batch.cursor = entry.cursor
                if len(batch.groups) >= self.settings.groups_per_step:
                    break
            watch.check(batch)
        return batch

    def _in_pass_range(self, prompt_id: str) -> bool:
        rate = self.problems[prompt_id].pass_rate if prompt_id in self.problems else None
        return rate is None or self.settings.pass_rate_min <= rate <= self.settings.pass_rate_max

    def train_step(self, batch: Batch, stop: threading.Event | None = None) -> dict[str, float]:
        """The optimizer steps of one policy version; returns its metrics. :class:`Abandoned` when
        ``stop`` is set meanwhile (a single process only)."""
        metrics = self.learner.step(batch, self.state.step, stop)
        self.state.optimizer_steps = self.learner.optimizer_steps
        return metrics

    def publish(self, batch: Batch, metrics: dict[str, float]) -> SignedManifest | None:
        """Write step N + 1, checkpoint, register it (the leader; other ranks only advance)."""
        step = self.state.step + 1
        directory = step_dir(self.origin_dir, self.run_id, step)
        gathered = full_state_dict(self.learner.module, self.where)
        if not self.where.leader:
            self.state = self.state.model_copy(update={"step": step, "cursor": batch.cursor})
            return None
        directory.mkdir(parents=True, exist_ok=True)
        with spent("publishing"):
            self.model.save_pretrained(directory, state_dict=gathered)
            self.tokenizer.save_pretrained(directory)
        signed = publish_step(self.origin_dir, self.run_id, step, self.account, chunk_size=self.settings.chunk_size)
        self.state = Checkpoint(
            step=step,
            cursor=batch.cursor,
            optimizer_steps=self.state.optimizer_steps,
            manifest=signed.model_dump_json(),
            consumed=[*self.state.consumed, (step, self.state.cursor, batch.cursor)],
        )
        saved = {"state": self.state.model_dump(), "optimizer": self.learner.optimizer.state_dict()}
        with spent("checkpoint"):
            write_atomic_with(self.checkpoint_dir / CHECKPOINT, lambda f: torch.save(saved, f))
        self._register(signed)
        body = TrainerMetricsRequest(
            address=self.account.address, run_id=self.run_id, step=step, metrics=metrics, cursor=batch.cursor
        )
        self.api.trainer_metrics(body)
        return signed

    def _register(self, signed: SignedManifest) -> None:
        self.api.publish_manifest(signed)

    def _publish_when_vouched(self, signed: SignedManifest, wait_s: float, stop: threading.Event, who: str) -> bool:
        """Publish, waiting up to ``wait_s`` (or ``stop``) for trainer islands' vouches; False if they never came."""
        deadline = time.monotonic() + wait_s
        while True:
            try:
                self._register(signed)
                return True
            except Refused as e:
                if e.code != ErrorCode.awaiting_vouches:
                    raise
                if time.monotonic() > deadline or stop.is_set():
                    log.warning("%s: policy step %d left unpublished: %s", who, signed.manifest.step, e.message)
                    return False
            stop.wait(0.25)

    def run(
        self,
        stop: threading.Event,
        steps: int | None = None,
        on_step: StepHook | None = None,
    ) -> int:
        """Train until ``stop`` (or until policy step ``steps`` is published); returns the step reached."""
        if self.settings.threads is not None:
            torch.set_num_threads(self.settings.threads)
        while not stop.is_set() and (steps is None or self.state.step < steps):
            started = time.perf_counter()
            batch = self.collect(stop) if self.where.leader else None
            if self.where.world_size > 1:
                shared = [batch]
                torch.distributed.broadcast_object_list(shared, src=0)  # every rank trains on the leader's batch
                batch = shared[0]
            if batch is None:
                break
            try:
                metrics = self.train_step(batch, stop)
            except Abandoned:
                break  # nothing of this step was kept: a restart takes it again from the checkpoint
            metrics["step_s"] = time.perf_counter() - started
            if self.publish(batch, metrics) is None:
                continue  # another rank publishes and reports
            log.info("published step %d: %s", self.state.step, metrics)
            if on_step is not None:
                on_step(self.state.step, metrics, batch)
        return self.state.step
