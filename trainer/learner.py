"""The GRPO update of one policy version, apart from where the groups come from.

:class:`Learner` owns the model, its FSDP wrapper and the AdamW optimizer. ``step`` takes
``optimizer_steps`` steps on the token-level GRPO loss of a batch's groups against the
logprobs their generator recorded, and returns the step's metrics. The network's trainer
(:mod:`trainer.loop`) feeds it accepted rollouts; the single-process baseline of
``bench/learning.py`` feeds it rollouts it generated itself, so both learn by the same recipe.
"""

from __future__ import annotations

import math
import threading

import torch

from intellect_protocol.shared.cpu_ledger import spent
from intellect_protocol.trainer.data import Batch
from intellect_protocol.trainer.distributed import Placement, clip_grad_norm, shard
from intellect_protocol.trainer.logprobs import sequence_logprobs
from intellect_protocol.trainer.loss import group_advantages, grpo_loss
from intellect_protocol.trainer.settings import TrainerSettings


def micro_batches(lengths: list[int], count: int) -> tuple[torch.Tensor, ...]:
    """``count`` micro-batches of the sequences of ``lengths`` (indices into them), each of sequences of like length:
    a micro-batch is padded to its longest, and long reasoning varies from one to twice the shortest."""
    return torch.tensor(sorted(range(len(lengths)), key=lengths.__getitem__), dtype=torch.long).tensor_split(count)


class Abandoned(Exception):
    """A step given up between micro-batches because its ``stop`` was set."""


class Learner:
    def __init__(
        self, model: torch.nn.Module, settings: TrainerSettings, temperature: float, where: Placement, optimizer_steps: int = 0
    ) -> None:
        """``temperature``: the run's sampling temperature (recorded logprobs are of logits / T);
        ``optimizer_steps``: how many were taken before (warmup continues across restarts)."""
        self.model = model
        self.settings = settings
        self.temperature = temperature
        self.where = where
        self.module = shard(model, where)
        """What the loss runs through: the model itself, or its FSDP wrapper under torchrun."""
        self.optimizer = torch.optim.AdamW(self.module.parameters(), lr=settings.lr, weight_decay=settings.weight_decay)
        self.optimizer_steps = optimizer_steps

    def step(self, batch: Batch, policy_step: int, stop: threading.Event | None = None) -> dict[str, float]:
        """The optimizer steps that make policy ``policy_step + 1`` from ``batch``; returns its metrics.

        Each optimizer step accumulates gradients over micro-batches of at most ``micro_batch``
        sequences (every part normalised by the whole batch, so the sum is the full batch's
        gradient). A single process checks ``stop`` between them and raises :class:`Abandoned`:
        the weights it may have moved were never published nor checkpointed, so a restart takes
        the step again from the last checkpoint. FSDP ranks never abandon alone (the others would
        wait in a collective); torchrun stops them."""
        everything = [r for g in batch.groups for r in g.rollouts]
        group_ids = torch.tensor([i for i, g in enumerate(batch.groups) for _ in g.rollouts])
        all_advantages = group_advantages(
            torch.tensor([r.reward for r in everything]), group_ids, self.settings.loss.advantage_eps
        )
        # Data parallel under FSDP: each rank takes every world_size-th sequence of the batch.
        rank, world = self.where.rank, self.where.world_size
        rollouts, advantages = everything[rank::world], all_advantages[rank::world]
        # As many micro-batches on every rank (each backward is a collective under FSDP).
        parts = micro_batches(
            [len(r.prompt_tokens) + len(r.completion_tokens) for r in rollouts],
            max(1, math.ceil(len(everything) // world / self.settings.micro_batch)),
        )
        share = (float(sum(r.sampled_tokens() for r in everything)), world)
        may_abandon = stop if world == 1 else None
        metrics: dict[str, float] = {}
        skipped = 0
        for _ in range(self.settings.optimizer_steps):
            self._set_lr()
            self.optimizer.zero_grad()
            totals = dict.fromkeys(("loss", "clip_low", "clip_high", "ratio_mean", "entropy"), 0.0)
            capped = negative = 0.0
            with spent("forward/backward"):
                for part in parts:
                    if may_abandon is not None and may_abandon.is_set():
                        raise Abandoned
                    chosen = [rollouts[i] for i in part.tolist()]
                    logp, entropy, mask = sequence_logprobs(
                        self.module, [r.prompt_tokens for r in chosen], [r.completion_tokens for r in chosen], self.temperature
                    )
                    behaviour = torch.zeros_like(logp)  # [micro, T]
                    for i, r in enumerate(chosen):
                        behaviour[i, : len(r.logprobs)] = torch.tensor(r.logprobs)
                        if r.sampled is not None:  # the environment's tokens are context the model read, not actions
                            mask[i, : len(r.sampled)] &= torch.tensor(r.sampled, device=mask.device)
                    loss, stats = grpo_loss(
                        logp, behaviour, advantages[part].to(logp.device), mask, self.settings.loss, entropy=entropy, share=share
                    )
                    loss.backward()
                    for key in totals:  # each part's figures are normalised by the whole batch: they add up
                        totals[key] += getattr(stats, key)
                    negatives = float(((advantages[part] < 0)[:, None].to(mask.device) & mask).sum())
                    capped, negative = capped + stats.clip_delta * negatives, negative + negatives
            with spent("optimizer"):
                grad_norm = float(clip_grad_norm(self.module, self.settings.max_grad_norm))
            if not math.isfinite(grad_norm):
                # One non-finite value would poison every weight; the norm is global under FSDP, so
                # every rank skips the same step.
                self.optimizer.zero_grad()
                skipped += 1
                continue
            with spent("optimizer"):
                self.optimizer.step()
            self.optimizer_steps += 1
            metrics = totals | {"clip_delta": capped / max(negative, 1.0), "grad_norm": grad_norm}
        metrics |= {
            "reward": sum(r.reward for r in everything) / len(everything),
            "task_reward": sum(r.task_reward for r in everything) / len(everything),
            "length": sum(len(r.completion_tokens) for r in everything) / len(everything),
            "staleness": sum(policy_step - g.policy_step for g in batch.groups) / len(batch.groups),
            "groups": float(len(batch.groups)),
            "dropped_stale": float(batch.stale),
            "dropped_flat": float(batch.flat),
            "dropped_off_range": float(batch.off_range),
            "dropped_untrained_rows": float(batch.untrained),
            "skipped_nonfinite": float(skipped),
        }
        return metrics

    def _set_lr(self) -> None:
        warm = self.settings.warmup_steps
        scale = min(1.0, (self.optimizer_steps + 1) / warm) if warm else 1.0
        for group in self.optimizer.param_groups:
            group["lr"] = self.settings.lr * scale
