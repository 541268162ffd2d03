"""Seeded sampling that a validator can replay token by token.

Each token is ``argmax(logits / T + g)`` over the tokens the nucleus (top-p) keeps, where
``g`` is Gumbel noise that depends only on the sequence's seed, the token's position in the
completion (0 for the first generated token) and the vocabulary index: never on the batch,
the device or the order of work. The Gumbel-max trick makes this an exact draw from
``softmax(logits / T)`` restricted to the nucleus.

The noise for (seed, position, token) is a counter-based hash, done in int64 torch ops so
CPU and GPU produce the same bits::

    x = seed * 0x9E3779B97F4A7C15 + position * 0xD1B54A32D192ED03 + token * 0x8CB92BA72F3D8DD7   (mod 2^64)
    x = splitmix64_finalizer(x)
    u = (top 23 bits of x + 0.5) / 2^23              # in (0, 1), exact in float32
    g = float32(-log(-log(u)))                         # computed in float64

23 bits, not 24: ``(2^24 - 1) + 0.5`` rounds to ``2^24`` in float32, so one value in 2^24 gave
``u = 1`` and infinite noise, and that token won whatever the model said of it (at a 151,936-token
vocabulary, about one position in a hundred drew a token uniformly at random).

Temperature 0 means greedy (argmax of the logits, no noise). The logprob recorded for a
sampled token is ``log_softmax(logits / T)`` at that token (the policy at temperature T,
before top-p), which the trainer uses for its importance ratios.
"""

from __future__ import annotations

import torch

MASK64 = (1 << 64) - 1


def _i64(value: int) -> int:
    """An unsigned 64-bit constant as the signed int64 torch stores."""
    return value - (1 << 64) if value >= 1 << 63 else value


K_SEED, K_POSITION, K_TOKEN = _i64(0x9E3779B97F4A7C15), _i64(0xD1B54A32D192ED03), _i64(0x8CB92BA72F3D8DD7)
M1, M2 = _i64(0xBF58476D1CE4E5B9), _i64(0x94D049BB133111EB)


def _shr(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 (torch's >> is arithmetic)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def gumbel_noise(seeds: torch.Tensor, positions: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Noise ``[batch, vocab]`` (float32) for each row's (seed, position); see the module docstring."""
    device = seeds.device
    tokens = torch.arange(vocab_size, dtype=torch.int64, device=device)
    x = (seeds.to(torch.int64) * K_SEED + positions.to(torch.int64) * K_POSITION)[:, None] + tokens[None, :] * K_TOKEN
    x = (x ^ _shr(x, 30)) * M1
    x = (x ^ _shr(x, 27)) * M2
    x = x ^ _shr(x, 31)
    return gumbel_of(_shr(x, 41))


def gumbel_of(bits: torch.Tensor) -> torch.Tensor:
    """Gumbel noise (float32, always finite) from 23 uniform random ``bits`` (int64 in ``[0, 2^23)``).

    Computed in float64, then rounded to float32: float32 logarithms are not correctly rounded, and a GPU's
    differ from a CPU's in the last bit (measured on an H200 by ``bench/gpu.py``), while float64 ones agree to
    far below float32's last bit, so devices round to the same noise but for a value lying that close to a
    rounding boundary: 0 of 607,744 values differed in two H200 runs, 1 (by 9.3e-10) in a third. A draw moves
    only where its top two scores tie that closely, which the sampling check's tolerance absorbs."""
    u = (bits.to(torch.float64) + 0.5) / float(1 << 23)
    return (-torch.log(-torch.log(u))).to(torch.float32)


def nucleus_mask(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """True for tokens inside the smallest set whose probability reaches ``top_p`` (rows of ``logits``)."""
    if top_p >= 1.0:
        return torch.ones_like(logits, dtype=torch.bool)
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
    # Keep a token if the mass before it is still short of top_p (so the first is always kept).
    keep_sorted = (cumulative - sorted_logits.softmax(dim=-1)) < top_p
    return torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)


def sampling_scores(
    logits: torch.Tensor, seeds: torch.Tensor, positions: torch.Tensor, temperature: float, top_p: float = 1.0
) -> torch.Tensor:
    """The scores ``[batch, vocab]`` whose argmax is the sampled token; a validator compares margins on them."""
    logits = logits.float()
    if temperature == 0:
        return logits
    scaled = logits / temperature
    # The noise is made where the logits are (a GPU's are never copied to the host for it).
    scores = scaled + gumbel_noise(seeds.to(logits.device), positions.to(logits.device), logits.shape[-1])
    return scores.masked_fill(~nucleus_mask(scaled, top_p), float("-inf"))


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor, temperature: float) -> torch.Tensor:
    """``log_softmax(logits / T)`` at ``tokens`` (T = 0 counts as 1)."""
    scaled = logits.float() / (temperature or 1.0)
    return scaled.log_softmax(dim=-1).gather(-1, tokens.to(logits.device)[:, None])[:, 0]


def sample(
    logits: torch.Tensor, seeds: torch.Tensor, positions: torch.Tensor, temperature: float, top_p: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row of ``logits [batch, vocab]``; returns (tokens, their logprobs)."""
    tokens = sampling_scores(logits, seeds, positions, temperature, top_p).argmax(dim=-1)
    return tokens, token_logprobs(logits, tokens, temperature)


def replay(logits: torch.Tensor, seed: int, temperature: float, top_p: float = 1.0) -> torch.Tensor:
    """The tokens a sequence with ``seed`` must have drawn, given the logits ``[n, vocab]`` that chose them."""
    n = logits.shape[0]
    positions = torch.arange(n, dtype=torch.int64, device=logits.device)
    seeds = torch.full((n,), seed, dtype=torch.int64, device=logits.device)
    return sampling_scores(logits, seeds, positions, temperature, top_p).argmax(dim=-1)
