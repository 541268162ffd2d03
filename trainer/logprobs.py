"""The sampled tokens' log-probabilities (and each position's entropy) under the policy being trained,
without the full distribution in fp32.

The model runs once over ``prompt + completion[:-1]`` per row and keeps logits only from the first
position any completion token is predicted from (``logits_to_keep``), in the model's own dtype
and on its device. The log-softmax is then taken a block of positions at a time: each block is
cast to fp32, reduced to a log-normaliser, the sampled token's logit and the entropy, and
checkpointed, so the backward pass recomputes it instead of keeping every block's softmax. Peak
extra memory is one block (``block_tokens x vocab`` fp32), not ``[B, T, vocab]``: at a 150k
vocabulary and 8k tokens a row that is 4.8 GB, a 1024-token block 0.6 GB.
"""

from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint

BLOCK_TOKENS = 1024
"""Positions whose fp32 log-softmax is held at once."""


def sequence_logprobs(
    model: torch.nn.Module,
    prompts: list[list[int]],
    completions: list[list[int]],
    temperature: float,
    block_tokens: int = BLOCK_TOKENS,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Log-probabilities ``[B, T]`` of each completion token under ``model`` (logits / T, as the node
    sampled), the per-position entropy ``[B, T]`` and the token mask ``[B, T]``, on the model's device."""
    device = next(model.parameters()).device
    rows = [p + c[:-1] for p, c in zip(prompts, completions)]
    width, longest = max(map(len, rows)), max(map(len, completions))
    first = min(len(p) for p in prompts) - 1  # no completion token is predicted from an earlier position
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    index = torch.zeros(len(rows), longest, dtype=torch.long)  # into the kept logits
    tokens = torch.zeros(len(rows), longest, dtype=torch.long)
    mask = torch.zeros(len(rows), longest, dtype=torch.bool)
    for i, (prompt, completion) in enumerate(zip(prompts, completions)):
        ids[i, : len(rows[i])] = torch.tensor(rows[i])
        n = len(completion)
        index[i, :n] = torch.arange(len(prompt) - 1 - first, len(prompt) - 1 - first + n)
        tokens[i, :n] = torch.tensor(completion)
        mask[i, :n] = True
    logits = model(input_ids=ids.to(device), use_cache=False, logits_to_keep=width - first).logits  # [B, width - first, vocab]
    index, tokens = index.to(device), tokens.to(device)
    logp, entropy = [], []
    for start in range(0, longest, block_tokens):
        block = slice(start, start + block_tokens)
        lp, h = checkpoint(_block, logits, index[:, block], tokens[:, block], temperature or 1.0, use_reentrant=False)
        logp.append(lp)
        entropy.append(h)
    return torch.cat(logp, 1), torch.cat(entropy, 1), mask.to(device)


def _block(
    logits: torch.Tensor, index: torch.Tensor, tokens: torch.Tensor, temperature: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``log_softmax(logits / T)`` at ``tokens`` and the entropy, at positions ``index [B, t]``."""
    scaled = logits.gather(1, index[:, :, None].expand(-1, -1, logits.shape[-1])).float() / temperature  # [B, t, vocab]
    normaliser = scaled.logsumexp(-1)  # [B, t]
    logp = scaled.gather(-1, tokens[:, :, None])[:, :, 0] - normaliser
    entropy = normaliser - (scaled.softmax(-1) * scaled).sum(-1)
    return logp, entropy
