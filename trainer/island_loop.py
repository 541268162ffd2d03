"""The trainer as one island among several (``intellect-trainer run --island NAME --lighthouse URL``).

Per outer step: ``sync_every`` inner GRPO updates, each on ``groups_per_step`` groups from accepted submissions this
island claimed (no other island holds them: :mod:`shared.island_schemas`); then the claims those updates learned from
are reported under the step's attempt, and the islands meet (:class:`trainer.islands.OuterSync`; with the run's
``overlap``, while the next round trains). After a committed meeting every island builds the next policy step's files
from the agreed weights and vouches for their content and for the island the meeting chose to publish
(:mod:`coordinator.services.step_vouches`); that island publishes them through shardcast once most live islands
vouch, and settles the step: the included islands' claims are consumed, the others' go back to the pool.

Nothing is trained on twice or lost: a claim is consumed only once a step that averaged it is published; an island
that restarts gives back what it held unreported and recovers the agreed weights from a live peer, which it keeps
only if the coordinator holds the same content for that step; a publisher that dies after the meeting leaves its step
unpublished, and the next meeting's publisher publishes the following step and settles both. The island's own state
is saved after every meeting, so an island that finds no live peer resumes from it.

An island may be FSDP ranks under ``torchrun`` (every island of a run the same number): its first rank talks to the
coordinator and publishes, and every decision it takes is broadcast to the others.
"""

from __future__ import annotations

import functools
import logging
import shutil
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar, cast

import torch
from eth_account.signers.local import LocalAccount
from transformers import PreTrainedModel

from intellect_protocol.shared.coordinator_client import Refused
from intellect_protocol.shared.files import write_atomic_with
from intellect_protocol.shared.island_schemas import (
    IslandClaim,
    IslandHealCheck,
    IslandJoin,
    IslandReport,
    IslandSettle,
    IslandVouch,
    OuterSettings,
    step_record,
)
from intellect_protocol.shared.run_schemas import oldest_usable_step
from intellect_protocol.shared.schemas import AcceptedRollouts, TrainerMetricsRequest
from intellect_protocol.shared.shardcast.manifest import build_manifest
from intellect_protocol.shared.shardcast.origin import publish_step, step_dir
from intellect_protocol.trainer.data import Batch, NoSignalWatch, add_submission, fetch_files
from intellect_protocol.trainer.distributed import full_state_dict
from intellect_protocol.trainer.islands import OuterStep, OuterSync
from intellect_protocol.trainer.learner import Abandoned
from intellect_protocol.trainer.loop import StepHook, Trainer
from intellect_protocol.trainer.settings import TrainerSettings

log = logging.getLogger("intellect.trainer.island")
T = TypeVar("T")
STATE = "island-state.pt"


class IslandTrainer(Trainer):
    def __init__(
        self,
        coordinator: str,
        account: LocalAccount,
        run_id: str,
        island: str,
        lighthouse: str,
        origin_dir: Path,
        checkpoint_dir: Path,
        settings: TrainerSettings | None = None,
        stop: threading.Event | None = None,
        host: str = "127.0.0.1",
    ) -> None:
        """``host``: where the other islands reach this one (its recovery server and store)."""
        super().__init__(coordinator, account, run_id, origin_dir, checkpoint_dir, settings, stop)
        self.island = island
        self.stop = stop or threading.Event()
        self.outer_settings = self.run_info.outer or OuterSettings()
        # Each rank of an FSDP island keeps its own shard of the state.
        self.state_file = checkpoint_dir / (STATE if self.where.world_size == 1 else f"island-state-{self.where.rank}.pt")
        saved = torch.load(self.state_file, weights_only=True) if self.state_file.exists() else None
        module = self.learner.module
        if saved is not None:
            with torch.no_grad():
                for p, agreed in zip(module.parameters(), saved["outer"]["agreed"]):
                    p.copy_(agreed)
            self.learner.optimizer.load_state_dict(saved["inner"])
        where = self.where
        step = saved["step"] if saved else 0
        self.sync = OuterSync(
            module,
            island,
            lighthouse,
            self.outer_settings,
            step,
            host,
            rank=where.rank,
            world_size=where.world_size,
            check_heal=self._check_heal,
            keep_sent=self.audited(),
        )
        if saved is not None:
            self.sync.load_state_dict(saved["outer"])
        if where.leader:
            released = self.api.island_join(self._body(IslandJoin))
            log.info("island %s joined %s at step %d (%d unreported claims given back)", island, run_id, step, released)
        self.queue: list[AcceptedRollouts] = []
        """Claimed and not yet used."""
        self.seen: set[int] = set()
        self.used: list[int] = []
        """Claims this outer step's inner updates learned from."""
        self.warned_two = False
        self._landed: OuterStep | None = None
        """Overlapped: the meeting last waited for."""
        self._round: tuple[dict[str, float], float] = ({}, time.perf_counter())
        """Overlapped: the metrics and start of the round whose meeting is in flight."""

    def _body(self, schema: type[Any], **fields: Any) -> Any:
        return schema(address=self.account.address, run_id=self.run_id, island=self.island, **fields)

    @property
    def step(self) -> int:
        return self.sync.step

    def close(self) -> None:
        self.sync.close()
        super().close()

    def collect(self, stop: threading.Event) -> Batch | None:
        """Groups for one inner update from this island's claims, or None if ``stop`` came first."""
        oldest = oldest_usable_step(self.sync.step, self.run_info.async_level)
        batch = Batch()
        watch = NoSignalWatch(self.sync.step)
        while len(batch.groups) < self.settings.groups_per_step:
            watch.check(batch)
            if not self.queue:
                claim = self._body(IslandClaim, limit=self.settings.groups_per_step, wait_s=self.settings.accepted_wait_s)
                fresh = [e for e in self.api.island_claim(claim) if e.cursor not in self.seen]
                self.seen.update(e.cursor for e in fresh)
                self.queue.extend(fresh)
                if not fresh:
                    if stop.is_set():
                        return None
                    continue
            entry = self.queue.pop(0)
            self.used.append(entry.cursor)
            for _, rollouts in fetch_files(self.api, [entry], oldest):
                add_submission(batch, rollouts, oldest, self._in_pass_range, self.settings.online_filter)
                batch.untrained += len(entry.untrained_rows) if rollouts is not None else 0
        return batch

    def inner_steps(self, stop: threading.Event) -> dict[str, float] | None:
        """The inner steps of one outer step: ``sync_every`` GRPO updates on this island's claims; the last one's
        metrics, or None if ``stop`` came first."""
        metrics: dict[str, float] = {}
        for _ in range(self.outer_settings.sync_every):
            batch = self._from_leader(lambda: self.collect(stop))  # every rank trains on the leader's batch
            if batch is None:
                return None
            metrics = self.train_step(batch, stop)
        return metrics

    def run(self, stop: threading.Event, steps: int | None = None, on_step: StepHook | None = None) -> int:
        """Inner updates and outer steps until ``stop`` (or until policy step ``steps`` is published); returns the step reached."""
        if self.settings.threads is not None:
            torch.set_num_threads(self.settings.threads)
        self._catch_up(stop)
        while not stop.is_set() and (steps is None or self.sync.step < steps):
            started = time.perf_counter()
            try:
                learnt = self.inner_steps(stop)
            except Abandoned:
                break
            if learnt is None:
                if self._land(on_step) and not stop.is_set():
                    continue  # the meeting in flight is published: what it settled may free more to learn
                return self.sync.step
            attempt = self._from_leader(lambda: uuid.uuid4().hex)  # the island's ranks tell the others one attempt
            if self.outer_settings.overlap:
                self._overlapped(attempt, learnt, started, on_step)
                continue
            outcome = self._meet(attempt, contribute=self._from_leader(functools.partial(self._report, attempt)))
            self.used = []
            self._after_meeting(outcome, learnt, started, on_step)
        self._land(on_step)
        return self.sync.step

    def _overlapped(self, attempt: str, metrics: dict[str, float], started: float, on_step: StepHook | None) -> None:
        """The run's meetings overlap the next round (:meth:`OuterSync.launch`): wait for the meeting in flight, report
        this round's claims under the step it makes next (unless the round started from a pseudo-gradient the run left
        out: then they go back), launch this round's meeting, and publish the waited one."""
        previous = self._landed = self.sync.wait()
        contribute = self._report(attempt)
        self._save()  # nothing in flight: the agreed weights hold still
        agreed = self._agreed_model()
        self.sync.launch(attempt, contribute)
        self.begin_inner()
        self.used = []
        if previous is not None:
            self._after_meeting(previous, *self._round, on_step, agreed)
        self._round = (metrics, started)

    def _land(self, on_step: StepHook | None) -> bool:
        """Overlapped: finish the meeting in flight and publish it; whether there was one."""
        if not self.sync.in_flight:
            return False
        outcome = self.sync.finish()
        self._save()
        if outcome is not None:
            self._after_meeting(outcome, *self._round, on_step)
        return True

    def _agreed_model(self) -> PreTrainedModel:
        """The model holding the agreed weights: the island's own, unless its rounds overlap the meetings (it holds the
        next round's start then)."""
        return self.model if self.sync.start is None else self.sync.agreed_copy(self.model)

    def _after_meeting(self, outcome: OuterStep, metrics: dict[str, float], started: float, on_step: StepHook | None, agreed: PreTrainedModel | None = None) -> None:  # fmt: skip
        if outcome.participants == 2 and not self.warned_two:
            self.warned_two = True
            log.warning(
                "island %s: this run's islands are two, and one bad island can stall it (cancel every step, never "
                "reverse it); from three islands on, one liar cannot move the agreed weights outside what the others send",
                self.island,
            )
        if not outcome.committed:
            return
        metrics.update(
            participants=outcome.participants,
            islands=len(outcome.included),
            sent_bytes=outcome.sent_bytes,
            step_s=time.perf_counter() - started,
        )
        log.info("island %s: outer step %d -> policy step %d, %s", self.island, outcome.step, outcome.step + 1, outcome)
        if self._vouch_and_publish(outcome, metrics, agreed or self.model) and on_step is not None:
            on_step(outcome.step + 1, metrics, outcome)

    def _meet(self, attempt: str, contribute: bool) -> OuterStep:
        outcome = self.sync.sync(attempt, contribute=contribute)
        self.begin_inner()
        self._save()
        return outcome

    def begin_inner(self) -> None:
        """After a meeting, before the next inner steps (and the state saved): the inner optimizer carries over."""

    def _catch_up(self, stop: threading.Event) -> None:
        """An island behind the run's published step joins the others' next meeting without adding
        anything, which hands it a live peer's state; refused after ``island_catch_up_s`` without one."""
        published = self._from_leader(lambda: self.api.run_info(self.run_id).policy_step)
        deadline = time.monotonic() + self.settings.island_catch_up_s
        while self._from_leader(lambda: self.sync.step < published and not stop.is_set()):
            # Alone at the lighthouse, this meeting takes no step; the others come at their next outer step. A
            # pause shorter than any lighthouse's join timeout keeps a request waiting there when they do.
            outcome = self._meet(uuid.uuid4().hex, contribute=False)
            if outcome.committed:  # the others stepped with it there: it vouches as they do
                self._vouch_and_publish(outcome, {}, self.model)
            if outcome.participants == 1:
                stop.wait(0.25)
            if self._from_leader(lambda: time.monotonic() > deadline and self.sync.step < published):
                raise RuntimeError(
                    f"island {self.island} holds policy step {self.sync.step}, the run is at {published}, and no live "
                    f"island met it in {self.settings.island_catch_up_s:.0f} s: start one that holds the step (or this "
                    "island with its checkpoint directory)"
                )
        self._save()

    def _report(self, attempt: str) -> bool:
        """Report this step's claims; False (stay out of the step, its claims given back) if some were given to another
        island meanwhile, or if it started from a pseudo-gradient of this island the run left out (overlapped)."""
        if not self.used:
            return False
        if not self.sync.started_from_record(self._landed):
            return self._stay_out("its last pseudo-gradient was left out, and this round started from it")
        report = {"outer_step": self.sync.step, "attempt": attempt, "cursors": self.used, "start_digest": self.sync.start_digest}
        try:
            self.api.island_report(self._body(IslandReport, **report))
            return True
        except Refused as e:
            if e.status != 409:
                raise
            return self._stay_out(e.message)

    def _stay_out(self, why: str) -> bool:
        log.warning("island %s stays out of outer step %d: %s", self.island, self.sync.step, why)
        self.api.island_join(self._body(IslandJoin))  # whatever it still holds goes back too
        self.forget_claims()
        return False

    def forget_claims(self) -> None:
        """The coordinator took back every claim of this island (it rejoined)."""
        self.queue, self.seen = [], set()

    def _vouch_and_publish(self, outcome: OuterStep, metrics: dict[str, float], agreed: PreTrainedModel) -> bool:
        """After a committed meeting: build the new policy step's files from ``agreed`` (the model holding its agreed
        weights) and vouch for them and the chosen publisher; as the publisher, publish them once most live islands
        vouch, and settle it and the committed step before (the earlier again, in case its own publisher died before
        it could). True if this island published."""
        step = outcome.step + 1
        if not outcome.publisher:
            log.warning(
                "island %s: outer step %d named no publisher: policy step %d is left to the next", self.island, outcome.step, step
            )
            return False
        gathered = full_state_dict(self.learner.module, self.where)  # every rank takes part
        if not self.where.leader:
            return False
        directory = step_dir(self.origin_dir, self.run_id, step) if outcome.leader else self.checkpoint_dir / "vouched"
        self._write_step(directory, gathered, agreed)
        if outcome.leader:
            self.judge(metrics, agreed, gathered)
        chunk_size = self.outer_settings.chunk_size
        signed = publish_step(self.origin_dir, self.run_id, step, self.account, chunk_size=chunk_size) if outcome.leader else None
        manifest = signed.manifest if signed else build_manifest(directory, self.run_id, step, chunk_size=chunk_size)
        record = step_record(outcome.included, outcome.excluded)
        vouch = self._body(IslandVouch, step=step, content=manifest.content_digest(), publisher=outcome.publisher, record=record)
        try:
            self.api.island_vouch(vouch)
        except Refused as e:
            if e.status != 409:
                raise
            log.warning("island %s: vouching for policy step %d was refused: %s", self.island, step, e.message)
            return False
        if signed is None:
            return False
        self._settle(outcome.step - 1, led=True)  # an audited run takes no step from a publisher of an unsettled one
        if not self._publish_when_vouched(signed, self.settings.island_vouch_wait_s, self.stop, f"island {self.island}"):
            return False
        self.api.trainer_metrics(
            TrainerMetricsRequest(address=self.account.address, run_id=self.run_id, step=step, metrics=metrics)
        )
        self._settle(outcome.step - 1, outcome.step)
        return True

    def judge(self, metrics: dict[str, float], agreed: PreTrainedModel, gathered: dict[str, torch.Tensor] | None) -> None:
        """The publisher's measures of the agreed weights (``gathered``, whole, when ``agreed`` is sharded) for ``metrics``."""

    def _settle(self, *steps: int, led: bool = False) -> None:
        """Settle those of ``steps`` (outer steps) this island committed (``led``: and published) that are published."""
        for done in [c for c in self.sync.committed if c.step in steps and (c.leader or not led)]:
            try:
                self.upload_audited(self.api.island_settle(self._body(IslandSettle, **done.settled())).audits)
            except Refused as e:
                if e.status != 409:  # 409: not published (its publisher died first): the next publisher settles it
                    raise

    def audited(self) -> bool:
        """Whether this run's steps are audited, so every island keeps what it received (:attr:`OuterSync.sent`)."""
        return False

    def upload_audited(self, digests: list[str]) -> None:
        """Upload the pseudo-gradients a settling drew for audit (an RL run draws none)."""

    def _write_step(self, directory: Path, gathered: dict[str, torch.Tensor] | None, model: PreTrainedModel) -> None:
        """A policy step's files in ``directory`` (emptied first), from the island's gathered weights (or ``model``'s)."""
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir(parents=True)
        model.save_pretrained(directory, state_dict=gathered)
        self.tokenizer.save_pretrained(directory)

    def _check_heal(self) -> bool:
        """A peer's state is in the agreed weights: whether the coordinator holds its content for its step."""
        step = self.sync.step
        # Healed during an overlapped meeting, the model holds the next round, still training: judge a copy.
        model = self._agreed_model() if self.sync.in_flight else self.model
        gathered = full_state_dict(self.learner.module, self.where)  # every rank takes part

        def ask() -> bool:
            directory = self.checkpoint_dir / "healed"
            self._write_step(directory, gathered, model)
            content = build_manifest(directory, self.run_id, step, chunk_size=self.outer_settings.chunk_size).content_digest()
            try:
                self.api.island_heal_check(self._body(IslandHealCheck, step=step, content=content))
                return True
            except Refused as e:
                if e.status != 409:
                    raise
                log.warning("island %s: %s", self.island, e.message)
                return False

        return self._from_leader(ask)

    def _save(self) -> None:
        state = {"step": self.sync.step, "inner": self.learner.optimizer.state_dict(), "outer": self.sync.state_dict()}
        write_atomic_with(self.state_file, lambda f: torch.save(state, f))

    def _from_leader(self, decide: Callable[[], T]) -> T:
        """``decide()`` on the island's first rank, the same value on every rank (only it talks to the coordinator)."""
        if self.where.world_size == 1:
            return decide()
        shared = [decide() if self.where.leader else None]
        torch.distributed.broadcast_object_list(shared, src=0)
        return cast(T, shared[0])
