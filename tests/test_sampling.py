"""The seeded sampler: a fixed, batch-independent noise, exact Gumbel-max draws, and replay."""

from __future__ import annotations

import math

import pytest
import torch

from intellect_protocol.shared.sampling import gumbel_noise, gumbel_of, nucleus_mask, replay, sample

pytestmark = pytest.mark.unit


def test_noise_is_fixed_and_independent_of_the_batch() -> None:
    alone = gumbel_noise(torch.tensor([7]), torch.tensor([3]), 50)
    batched = gumbel_noise(torch.tensor([1, 7, 9]), torch.tensor([0, 3, 3]), 50)
    assert torch.equal(alone[0], batched[1])
    assert not torch.equal(batched[0], batched[1]) and not torch.equal(batched[1], batched[2])
    # The documented formula, computed with Python integers: the torch int64 version must agree,
    # on every device, or validators would re-derive different tokens.
    for seed, position in ((0, 0), (12345, 17), (2**62 + 5, 4000)):
        got = gumbel_noise(torch.tensor([seed]), torch.tensor([position]), 6)[0]
        assert torch.allclose(got, torch.tensor([documented_noise(seed, position, t) for t in range(6)]), atol=1e-5)


def documented_noise(seed: int, position: int, token: int) -> float:
    mask = (1 << 64) - 1
    x = (seed * 0x9E3779B97F4A7C15 + position * 0xD1B54A32D192ED03 + token * 0x8CB92BA72F3D8DD7) & mask
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & mask
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & mask
    x = x ^ (x >> 31)
    u = ((x >> 41) + 0.5) / 2**23
    return -math.log(-math.log(u))


def test_noise_is_finite_at_both_ends_of_its_range() -> None:
    # Infinite noise would draw its token whatever the model said of it.
    ends = gumbel_of(torch.tensor([0, 1, (1 << 23) - 2, (1 << 23) - 1]))
    assert torch.isfinite(ends).all() and ends[0] < ends[1] < ends[2] < ends[3] < 17


def test_noise_is_gumbel() -> None:
    g = gumbel_noise(torch.arange(4), torch.zeros(4, dtype=torch.long), 50_000)
    assert abs(g.mean().item() - 0.5772) < 0.02 and abs(g.std().item() - 1.2825) < 0.02


def test_draws_follow_the_tempered_distribution() -> None:
    logits = torch.tensor([1.0, 0.0, -1.0, 2.0])
    n = 20_000
    for temperature in (0.5, 1.0):
        tokens, _ = sample(logits.expand(n, 4), torch.arange(n), torch.zeros(n, dtype=torch.long), temperature)
        freq = torch.bincount(tokens, minlength=4) / n
        assert torch.allclose(freq, (logits / temperature).softmax(-1), atol=0.015)


def test_top_p_and_greedy() -> None:
    logits = torch.tensor([[1.0, 0.0, -1.0, 2.0]])
    assert nucleus_mask(logits, 0.7).tolist() == [[True, False, False, True]]
    assert nucleus_mask(logits, 0.01).tolist() == [[False, False, False, True]]
    n = 5000
    tokens, _ = sample(logits.expand(n, 4), torch.arange(n), torch.zeros(n, dtype=torch.long), 1.0, top_p=0.7)
    assert set(tokens.tolist()) == {0, 3}
    tokens, logprobs = sample(logits.expand(3, 4), torch.arange(3), torch.zeros(3, dtype=torch.long), 0.0)
    assert tokens.tolist() == [3, 3, 3]
    assert torch.allclose(logprobs, logits.log_softmax(-1)[0, 3].expand(3))


def test_replay_rederives_each_token() -> None:
    torch.manual_seed(0)
    logits = torch.randn(30, 100)
    drawn = [int(sample(logits[i : i + 1], torch.tensor([99]), torch.tensor([i]), 0.8, 0.95)[0]) for i in range(30)]
    assert replay(logits, 99, 0.8, 0.95).tolist() == drawn
    assert replay(logits, 98, 0.8, 0.95).tolist() != drawn
