"""The trainer's blockwise log-softmax equals the full-distribution computation, values and gradients."""

from __future__ import annotations

import random

import pytest
import torch

from intellect_protocol.shared.models import TINY_MODEL_DIR, load_model
from intellect_protocol.trainer.logprobs import sequence_logprobs

pytestmark = pytest.mark.unit


def full_distribution(model, prompts, completions, temperature):
    """The definition: log_softmax over the whole vocabulary at every completion position, in fp32."""
    logp, entropy = [], []
    for prompt, completion in zip(prompts, completions):
        ids = torch.tensor([prompt + completion[:-1]])
        logits = model(input_ids=ids, use_cache=False).logits[0, len(prompt) - 1 :].float() / temperature  # [n, vocab]
        full = logits.log_softmax(-1)
        logp.append(full.gather(-1, torch.tensor(completion)[:, None])[:, 0])
        entropy.append(-(full.exp() * full).sum(-1))
    return logp, entropy


@pytest.mark.parametrize("block_tokens", [3, 1024])
def test_blockwise_logprobs_and_gradients_equal_the_full_computation(block_tokens: int) -> None:
    torch.manual_seed(0)
    model, _ = load_model(str(TINY_MODEL_DIR))
    rng = random.Random(block_tokens)
    vocab = model.config.vocab_size
    prompts = [[rng.randrange(vocab) for _ in range(n)] for n in (5, 9, 2)]
    completions = [[rng.randrange(vocab) for _ in range(n)] for n in (7, 1, 11)]

    logp, entropy, mask = sequence_logprobs(model, prompts, completions, 0.7, block_tokens=block_tokens)
    (logp[mask].sum() + 0.1 * entropy[mask].sum()).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()

    want_logp, want_entropy = full_distribution(model, prompts, completions, 0.7)
    (sum(x.sum() for x in want_logp) + 0.1 * sum(x.sum() for x in want_entropy)).backward()
    for i, n in enumerate(len(c) for c in completions):
        assert mask[i].sum() == n
        torch.testing.assert_close(logp[i, :n], want_logp[i], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(entropy[i, :n], want_entropy[i], rtol=1e-5, atol=1e-5)
    assert grads.keys() == {n for n, p in model.named_parameters() if p.grad is not None}
    for name, p in model.named_parameters():
        # Batched and row-by-row sums differ in fp32 rounding only: tolerance relative to the gradient's scale.
        scale = float(p.grad.abs().max())
        torch.testing.assert_close(grads[name], p.grad, rtol=1e-4, atol=1e-4 * scale, msg=lambda m, name=name: f"{name}: {m}")
