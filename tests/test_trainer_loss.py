"""The GRPO loss, branch by branch, against values worked out by hand."""

from __future__ import annotations

import math

import pytest
import torch

from intellect_protocol.trainer.loss import LossSettings, group_advantages, grpo_loss

pytestmark = pytest.mark.unit

S = LossSettings()  # delta 4, eps 0.2 / 0.2


def one_token(ratio: float, advantage: float, settings: LossSettings = S):
    logp_new = torch.tensor([[math.log(ratio)]], requires_grad=True)
    loss, stats = grpo_loss(logp_new, torch.zeros(1, 1), torch.tensor([advantage]), torch.ones(1, 1, dtype=torch.bool), settings)
    loss.backward()
    return float(loss.detach()), float(logp_new.grad[0, 0]), stats


@pytest.mark.parametrize(
    ("ratio", "advantage", "loss", "grad", "clip"),
    [
        (1.1, 1.0, -1.1, -1.1, None),  # inside the trust region: -r*A, gradient -r*A
        (1.5, 1.0, -1.2, 0.0, "clip_high"),  # A > 0, r above 1 + eps: clipped to 1.2, no gradient
        (0.5, 1.0, -0.5, -0.5, None),  # A > 0, r below 1 - eps: PPO keeps the unclipped (smaller) term
        (0.5, -1.0, 0.8, 0.0, "clip_low"),  # A < 0, r below 1 - eps: clipped to 0.8, no gradient
        (2.0, -1.0, 2.0, 2.0, None),  # A < 0, r above 1 + eps but under delta: unclipped, gradient -r*A
        (10.0, -1.0, 4.0, 0.0, "clip_delta"),  # A < 0, r above delta: bounded at delta = 4, no gradient
    ],
)
def test_each_clipping_branch(ratio: float, advantage: float, loss: float, grad: float, clip: str | None) -> None:
    got_loss, got_grad, stats = one_token(ratio, advantage)
    assert got_loss == pytest.approx(loss, abs=1e-6)
    assert got_grad == pytest.approx(grad, abs=1e-6)
    for name in ("clip_low", "clip_high", "clip_delta"):
        assert getattr(stats, name) == (1.0 if name == clip else 0.0)


def test_plain_ppo_would_not_bound_a_stale_negative_token() -> None:
    # Without the second side (delta -> huge) the same token's loss is 10, not 4.
    assert one_token(10.0, -1.0, LossSettings(delta=1e9))[0] == pytest.approx(10.0)


def test_token_mask_and_normalisers() -> None:
    logp_new = torch.log(torch.tensor([[1.1, 1.1, 7.0], [1.1, 0.9, 1.0]]))
    mask = torch.tensor([[True, True, False], [True, True, True]])
    advantages = torch.tensor([1.0, 2.0])
    # Real tokens: 1.1, 1.1 (A=1) and 1.1, 0.9, 1.0 (A=2): objectives 1.1 + 1.1 + 2.2 + 1.8 + 2.0 = 8.2 over 5 tokens.
    loss, _ = grpo_loss(logp_new, torch.zeros(2, 3), advantages, mask, S)
    assert float(loss.detach()) == pytest.approx(-8.2 / 5)
    constant, _ = grpo_loss(logp_new, torch.zeros(2, 3), advantages, mask, LossSettings(constant_normaliser=10))
    assert float(constant.detach()) == pytest.approx(-8.2 / 10)


def test_entropy_bonus_and_kl_penalty() -> None:
    logp_new = torch.log(torch.tensor([[1.0, 1.0]]))
    mask = torch.ones(1, 2, dtype=torch.bool)
    entropy = torch.tensor([[0.5, 1.5]])
    settings = LossSettings(entropy_coef=0.1, kl_coef=0.5)
    same, stats = grpo_loss(
        logp_new, torch.zeros(1, 2), torch.tensor([1.0]), mask, settings, entropy=entropy, logp_reference=logp_new
    )
    assert float(same.detach()) == pytest.approx(-1.0 - 0.1 * 1.0) and stats.kl == 0.0 and stats.entropy == pytest.approx(1.0)
    # Reference one nat below: k3 = exp(-1) - (-1) - 1 = exp(-1) per token.
    far, stats = grpo_loss(
        logp_new, torch.zeros(1, 2), torch.tensor([1.0]), mask, settings, entropy=entropy, logp_reference=logp_new - 1
    )
    assert stats.kl == pytest.approx(math.exp(-1))
    assert float(far.detach()) == pytest.approx(-1.0 - 0.1 + 0.5 * math.exp(-1))


def test_group_advantages() -> None:
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0, 0.5, 0.5, 3.0])
    groups = torch.tensor([0, 0, 0, 0, 1, 1, 2])
    advantages = group_advantages(rewards, groups)
    assert advantages[:4].tolist() == pytest.approx([1.0, -1.0, 1.0, -1.0], abs=1e-5)
    assert advantages[4:].tolist() == [0.0, 0.0, 0.0]  # no spread, no signal


@pytest.mark.parametrize("constant", [None, 64])
def test_data_parallel_parts_average_to_the_whole_batch_gradient(constant: int | None) -> None:
    """Under FSDP each rank takes every other sequence and the gradients are averaged: with
    ``share`` the average is the single-process gradient, whatever each part's token count."""
    torch.manual_seed(0)
    logp = torch.randn(6, 5, requires_grad=True)
    behaviour, advantages = logp.detach() + 0.1 * torch.randn(6, 5), torch.randn(6)
    mask = torch.rand(6, 5) > 0.3
    mask[0::2, 3:] = False  # the parts hold different numbers of tokens
    settings = LossSettings(constant_normaliser=constant)
    (whole,) = torch.autograd.grad(grpo_loss(logp, behaviour, advantages, mask, settings)[0], logp)

    def averaged(share: tuple[float, int] | None) -> torch.Tensor:
        parts = [grpo_loss(logp[r::2], behaviour[r::2], advantages[r::2], mask[r::2], settings, share=share)[0] for r in (0, 1)]
        return sum(torch.autograd.grad(part, logp)[0] for part in parts) / 2

    torch.testing.assert_close(averaged((float(mask.sum()), 2)), whole)
    if constant is None:
        assert not torch.allclose(averaged(None), whole)  # each part normalised by its own tokens is not the batch's gradient
