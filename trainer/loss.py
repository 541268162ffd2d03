"""The GRPO loss with INTELLECT-2's two-sided clipping, token level.

Shapes: ``B`` sequences, ``T`` completion positions (padded; ``mask`` marks real tokens).

    advantages   A_i = (R_i - mean(R_group)) / (std(R_group) + eps)      per sequence, within its group
    ratio        r_t = exp(logp_new_t - logp_behaviour_t)                 against the node's recorded logprobs
    objective_t  = min(r'_t * A,  clip(r_t, 1 - eps_low, 1 + eps_high) * A)
                   with r'_t = min(r_t, delta) when A < 0, else r_t       (the second side of the clipping)
    loss         = -sum_t(objective_t) / normaliser  - entropy_coef * H  + kl_coef * KL(new || reference)

Without the delta bound, a negative-advantage token whose probability grew far beyond the
behaviour policy's (stale rollouts make this common) has an unbounded objective; delta caps it.
The normaliser is the number of real tokens, or a constant (Dr. GRPO) so long and short
completions weigh the same per token.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from pydantic import BaseModel, Field


class LossSettings(BaseModel):
    delta: float = Field(4.0, gt=1)
    """Upper bound on the ratio for negative-advantage tokens (INTELLECT-2: 4)."""
    eps_low: float = Field(0.2, ge=0, lt=1)
    """PPO clip below 1 (INTELLECT-2: 0.2)."""
    eps_high: float = Field(0.2, ge=0)
    """PPO clip above 1 (INTELLECT-2: 0.2)."""
    entropy_coef: float = Field(0.0, ge=0)
    """Weight of the entropy bonus (INTELLECT-2: none)."""
    kl_coef: float = Field(0.0, ge=0)
    """Weight of the KL penalty to the reference policy (INTELLECT-2: none)."""
    constant_normaliser: int | None = Field(None, ge=1)
    """Divide the token sum by this constant (Dr. GRPO, e.g. batch x max tokens) instead of the token count."""
    advantage_eps: float = Field(1e-6, gt=0)


def group_advantages(rewards: torch.Tensor, groups: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """``rewards [B]`` normalised within each group (``groups [B]``: a group id per sequence)."""
    advantages = torch.zeros_like(rewards)
    for group in groups.unique():
        members = groups == group
        values = rewards[members]
        std = values.std(unbiased=False) if values.numel() > 1 else values.new_tensor(0.0)
        advantages[members] = (values - values.mean()) / (std + eps)
    return advantages


@dataclass
class LossStats:
    loss: float
    clip_low: float
    """Share of real tokens where the lower PPO clip was the binding term."""
    clip_high: float
    clip_delta: float
    """Share of negative-advantage tokens whose ratio the delta bound capped."""
    ratio_mean: float
    entropy: float
    kl: float


def grpo_loss(
    logp_new: torch.Tensor,
    logp_behaviour: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    settings: LossSettings,
    *,
    entropy: torch.Tensor | None = None,
    logp_reference: torch.Tensor | None = None,
    share: tuple[float, int] | None = None,
) -> tuple[torch.Tensor, LossStats]:
    """``logp_* [B, T]``, ``advantages [B]``, ``mask [B, T]`` bool; ``entropy [B, T]`` per position when a bonus is wanted.

    ``share``: (the whole batch's tokens, ranks) when this is one rank's part of a data-parallel
    batch whose gradients are averaged over the ranks: each part is then normalised by the whole
    batch, so the averaged gradient is the one a single process would take."""
    mask = mask.to(logp_new.dtype)
    adv = advantages[:, None].expand_as(logp_new)
    ratio = torch.exp(logp_new - logp_behaviour)
    negative = adv < 0
    bounded = torch.where(negative, torch.clamp(ratio, max=settings.delta), ratio)
    clipped = torch.clamp(ratio, 1 - settings.eps_low, 1 + settings.eps_high)
    objective = torch.minimum(bounded * adv, clipped * adv)

    batch_tokens, ranks = share if share is not None else (mask.sum().clamp(min=1), 1)
    tokens = batch_tokens / ranks
    normaliser = settings.constant_normaliser / ranks if settings.constant_normaliser else tokens
    loss = -(objective * mask).sum() / normaliser
    entropy_mean = (entropy * mask).sum() / tokens if entropy is not None else logp_new.new_tensor(0.0)
    kl_mean = logp_new.new_tensor(0.0)
    if logp_reference is not None:
        log_ratio = logp_reference - logp_new
        kl_mean = ((torch.exp(log_ratio) - log_ratio - 1) * mask).sum() / tokens  # k3 estimator, >= 0
    loss = loss - settings.entropy_coef * entropy_mean + settings.kl_coef * kl_mean

    with torch.no_grad():
        clipped_wins = (clipped * adv < bounded * adv) & (clipped != ratio)
        stats = LossStats(
            loss=float(loss.detach()),
            clip_low=float(((clipped_wins & (ratio < 1)).to(mask.dtype) * mask).sum() / tokens),
            clip_high=float(((clipped_wins & (ratio > 1)).to(mask.dtype) * mask).sum() / tokens),
            clip_delta=float(
                ((negative & (ratio > settings.delta)).to(mask.dtype) * mask).sum()
                / (negative.to(mask.dtype) * mask).sum().clamp(min=1)
            ),
            ratio_mean=float((ratio * mask).sum() / tokens),
            entropy=float(entropy_mean),
            kl=float(kl_mean),
        )
    return loss, stats
