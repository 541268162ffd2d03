"""The GRPO update of one policy version, apart from where the groups come from.

:class:`Learner` owns the model, its FSDP wrapper and the AdamW optimizer. ``step`` takes
``optimizer_steps`` steps on the token-level GRPO loss of a batch's groups against the
logprobs their generator recorded, and returns the step's metrics. The network's trainer
(:mod:`trainer.loop`) feeds it accepted rollouts; the single-process baseline of
``bench/learning.py`` feeds it rollouts it generated itself, so both learn by the same recipe.
"""

from __future__ import annotations

import math

import torch

from intellect_protocol.trainer.data import Batch
from intellect_protocol.trainer.distributed import Placement, clip_grad_norm, shard
from intellect_protocol.trainer.logprobs import sequence_logprobs
from intellect_protocol.trainer.loss import group_advantages, grpo_loss
from intellect_protocol.trainer.settings import TrainerSettings


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

    def step(self, batch: Batch, policy_step: int) -> dict[str, float]:
        """The optimizer steps that make policy ``policy_step + 1`` from ``batch``; returns its metrics."""
        everything = [r for g in batch.groups for r in g.rollouts]
        group_ids = torch.tensor([i for i, g in enumerate(batch.groups) for _ in g.rollouts])
        all_advantages = group_advantages(
            torch.tensor([r.reward for r in everything]), group_ids, self.settings.loss.advantage_eps
        )
        # Data parallel under FSDP: each rank takes every world_size-th sequence of the batch.
        rank, world = self.where.rank, self.where.world_size
        rollouts, advantages = everything[rank::world], all_advantages[rank::world]
        longest = max(len(r.completion_tokens) for r in rollouts)
        behaviour = torch.zeros(len(rollouts), longest)
        for i, r in enumerate(rollouts):
            behaviour[i, : len(r.logprobs)] = torch.tensor(r.logprobs)
        prompts, completions = [r.prompt_tokens for r in rollouts], [r.completion_tokens for r in rollouts]
        share = (float(sum(len(r.completion_tokens) for r in everything)), world)
        metrics: dict[str, float] = {}
        skipped = 0
        for _ in range(self.settings.optimizer_steps):
            self._set_lr()
            logp, entropy, mask = sequence_logprobs(self.module, prompts, completions, self.temperature)
            loss, stats = grpo_loss(
                logp,
                behaviour.to(logp.device),
                advantages.to(logp.device),
                mask,
                self.settings.loss,
                entropy=entropy,
                share=share,
            )
            self.optimizer.zero_grad()
            loss.backward()
            grad_norm = float(clip_grad_norm(self.module, self.settings.max_grad_norm))
            if not math.isfinite(grad_norm):
                # One non-finite value would poison every weight; the norm is global under FSDP, so
                # every rank skips the same step.
                self.optimizer.zero_grad()
                skipped += 1
                continue
            self.optimizer.step()
            self.optimizer_steps += 1
            metrics = {
                "loss": stats.loss,
                "clip_low": stats.clip_low,
                "clip_high": stats.clip_high,
                "clip_delta": stats.clip_delta,
                "ratio_mean": stats.ratio_mean,
                "entropy": stats.entropy,
                "grad_norm": grad_norm,
            }
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
