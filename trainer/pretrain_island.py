"""A trainer island of a pretraining run (``intellect-trainer run --island NAME`` on a run of kind ``pretrain``).

It differs from an RL island (:class:`trainer.island_loop.IslandTrainer`) only in what it learns from and how:
it claims shard slots (:mod:`coordinator.services.pretraining`), fetches each shard from the coordinator and checks
it against the run's corpus manifest, and takes next-token inner steps over a shard's rows in the epoch's order
(:func:`shared.pretraining.learning.learn_shard`, with the run's :class:`~shared.pretraining.settings.PretrainSettings`). An
outer step learns whole shards: at least ``sync_every`` inner steps, up to the end of the shard it is in, so the
slots an outer step reports are exactly the ones its pseudo-gradient learnt. Meetings, vouching, publishing and
settling are the RL island's. The island that publishes a step evaluates the agreed weights on the corpus'
held-out (and out-of-distribution) reads and posts held-out loss, perplexity and AUROC with the step's metrics.

It stops once the run's every slot is consumed and it holds none.
"""

from __future__ import annotations

import functools
import logging
import threading
from typing import Any

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel

from intellect_protocol.shared.coordinator_client import Refused
from intellect_protocol.shared.island_schemas import IslandClaim, ShardSlot
from intellect_protocol.shared.pretraining.corpus import fetch_shard
from intellect_protocol.shared.pretraining.evaluation import evaluate
from intellect_protocol.shared.pretraining.learning import batches, inner_step, optimizer_for
from intellect_protocol.shared.pretraining.manifest import CorpusManifest, ShardRef
from intellect_protocol.shared.pretraining.settings import PretrainSettings
from intellect_protocol.trainer.island_loop import IslandTrainer
from intellect_protocol.trainer.learner import Abandoned
from intellect_protocol.trainer.settings import TrainerSettings

log = logging.getLogger("intellect.trainer.pretrain_island")
CLAIM = 4
"""Slots claimed at a time: a few shards ahead, so a fetch never waits on a claim."""


class PretrainIsland(IslandTrainer):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.slots: list[ShardSlot] = []
        """Claimed and not yet learnt."""
        pad_id = self.corpus.pad_id
        held_out = self._from_leader(lambda: self.fetch(self.corpus.held_out))
        ood = self.corpus.out_of_distribution
        self.judged = (held_out, None if ood is None else self._from_leader(lambda: self.fetch(ood)), pad_id)

    @property
    def corpus(self) -> CorpusManifest:
        if self.run_info.corpus is None:
            raise ValueError(f"{self.run_id} is an RL run: start its islands without a corpus")
        return self.run_info.corpus

    @property
    def pretrain(self) -> PretrainSettings:
        return self.run_info.pretrain or PretrainSettings()

    def audited(self) -> bool:
        return self.pretrain.audit_rate > 0

    def upload_audited(self, digests: list[str]) -> None:
        for digest in digests:
            sent = self.sync.sent.get(digest)
            if sent is None:  # received before this island restarted: another island of the step uploads it
                log.warning("island %s: pseudo-gradient %s drawn for audit is not held here", self.island, digest[:12])
                continue
            try:
                self.api.upload_pseudo_gradient(self.run_id, sent.view(torch.int16).numpy().tobytes())
            except Refused as e:
                if e.status != 404:
                    raise
                log.info("island %s: pseudo-gradient %s is uploaded already (%s)", self.island, digest[:12], e.message)

    def _problems(self) -> dict[str, Any]:
        return {}  # a corpus, no environment

    def learner_settings(self) -> TrainerSettings:
        # The run's inner AdamW, constant: every island of the run takes the same steps on the same rows.
        p = self.pretrain
        update = {"lr": p.lr, "weight_decay": p.weight_decay, "max_grad_norm": p.max_grad_norm, "warmup_steps": 0}
        return self.settings.model_copy(update=update)

    def fetch(self, ref: ShardRef) -> torch.Tensor:
        """A shard's tokens, from this island's cache or the coordinator, checked against the corpus manifest."""
        return fetch_shard(
            functools.partial(self.api.corpus_shard, self.run_id), ref, self.corpus, self.checkpoint_dir / "shards"
        )

    def begin_inner(self) -> None:
        if self.pretrain.fresh_inner:
            self.learner.optimizer = optimizer_for(self.learner.module, self.pretrain)

    def forget_claims(self) -> None:
        super().forget_claims()
        self.slots = []

    def next_slot(self, stop: threading.Event) -> ShardSlot | None:
        """The next slot to learn; None when ``stop`` is set, when none is free and this outer step has learnt some
        (it meets with those rather than wait), or when the run's corpus is learnt."""
        while not self.slots:
            claims = self.api.island_claim_shards(self._body(IslandClaim, limit=CLAIM, wait_s=self.settings.accepted_wait_s))
            self.slots = [s for s in claims.slots if s.cursor not in self.seen]
            self.seen.update(s.cursor for s in self.slots)
            # A meeting in flight holds slots that may come back: it must land before the round can wait for them.
            if not self.slots and (stop.is_set() or self.used or claims.remaining == 0 or self.sync.in_flight):
                return None
        return self.slots.pop(0)

    def inner_steps(self, stop: threading.Event) -> dict[str, float] | None:
        """Whole shards until at least ``sync_every`` inner steps are taken, in the order ``used`` lists them (the
        order the report sends, and a replay needs); their mean loss, steps and tokens (this island's: the run's
        tokens trained are its islands' consumed shards'), or None if ``stop`` came first or nothing is left."""
        steps = tokens = 0
        loss_sum = 0.0
        while steps < self.outer_settings.sync_every:
            slot = self._from_leader(lambda: self.next_slot(stop))
            if slot is None:
                break
            rows = self._from_leader(functools.partial(self.fetch, slot.shard))
            for ids in batches(rows, self.pretrain, slot.epoch):  # [batch_rows, seq_len]
                if stop.is_set() and self.where.world_size == 1:
                    raise Abandoned
                loss, learnt = inner_step(self.learner.module, self.learner.optimizer, ids, self.corpus.pad_id, self.pretrain)  # type: ignore[arg-type]
                steps, tokens, loss_sum = steps + 1, tokens + learnt, loss_sum + loss
            self.used.append(slot.cursor)
        if stop.is_set() or not self.used:
            return None
        return {"loss": loss_sum / max(steps, 1), "inner_steps": steps, "island_tokens": tokens}

    def judge(self, metrics: dict[str, float], agreed: PreTrainedModel, gathered: dict[str, torch.Tensor] | None) -> None:
        """Held-out loss, perplexity and AUROC of the agreed weights: a sharded model runs only on all its ranks, so
        an island of several ranks judges a whole copy built from ``gathered`` on its first."""
        if gathered is not None:
            whole = AutoModelForCausalLM.from_config(getattr(agreed, "module", agreed).config)
            whole.load_state_dict(gathered)
            agreed = whole
        held_out, ood, pad_id = self.judged
        metrics.update(evaluate(agreed, held_out, ood, pad_id).model_dump(exclude_none=True))
