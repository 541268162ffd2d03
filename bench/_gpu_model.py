"""The model ``bench/gpu.py`` measures on: a random Qwen3-shaped one, and how much work each size does."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from intellect_protocol.shared.tiny_model import bpe_tokenizer


@dataclasses.dataclass(frozen=True)
class Plan:
    """The model's shape and how much work each part does."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    """The head's rows: at least the tokenizer's, more pad it as Qwen's 151,936 pad its tokenizer's 151,665."""
    max_tokens: int
    calibration_rows: int
    honest_rows: dict[int, int]
    """Honest rows per node batch size, in this order; the largest takes what is left of the budget's share, up to
    its figure. Generation is bound by the host's per-step work at these sizes, not by the card, so batch 256
    generates most of the rows the goal asks for in the time a run has."""
    forged_files: int
    """Files per forgery kind, of :data:`FORGED_ROWS` rows each."""


FULL = Plan(28, 1024, 16, 8, 128, 3072, 151_936, 64, 128, {1: 16, 8: 64, 64: 2_048, 256: 8_192}, 2)
SMALL = Plan(2, 64, 2, 1, 32, 128, 0, 16, 32, {1: 16, 8: 16, 64: 64}, 1)

FILE_ROWS = 16
"""Rows per honest file: the devnet's task size (4 prompts x 4 samples)."""
FORGED_ROWS = 4
"""Rows per forged file (1 prompt x 4 samples): the cherry-pickers re-run the model per branch."""
LOGIT_STD = 5.0
"""Logit spread the final norm's weights are scaled to: about 3 nats of entropy a token at Qwen's vocabulary, as a
trained model's peaked distributions (unscaled, every token is near 1 / 151,936 and sampling is noise).

Only the final norm (and the embeddings, :data:`EMBEDDING_SCALE`) are scaled. The first four H200 runs scaled every
weight matrix instead, which makes each layer's output hundreds of times its input: at the same entropy that model's
numerics are chaotic (on CPU, 8 layers, bf16: decode and prefill logits 0.098 apart on average against 0.036, 261
near-ties decided by numerics in 128 calibration rows against 136, 93 % of honest rows kept out of training against
70 %), so it told us less about a trained model's."""
EMBEDDING_SCALE = 0.1
"""The embeddings' scale: small beside what the layers add to the residual stream. The head shares them, and a token's
own embedding, a large share of a shallow model's last hidden state, would give its own logit a lead of several
standard deviations (the 2-layer model predicted its input token again with p = 0.99)."""


def build_model(plan: Plan, directory: Path, device: torch.device) -> tuple[int, int]:
    """A random Qwen3-shaped model and the tokenizer trained here, saved in ``directory``; (parameters, vocabulary)."""
    tokenizer = bpe_tokenizer(400)
    ids = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id, "pad_token_id": tokenizer.pad_token_id}
    config = AutoConfig.for_model(
        "qwen3",
        vocab_size=max(plan.vocab, len(tokenizer)),
        hidden_size=plan.hidden,
        intermediate_size=plan.intermediate,
        num_hidden_layers=plan.layers,
        num_attention_heads=plan.heads,
        num_key_value_heads=plan.kv_heads,
        head_dim=plan.head_dim,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        **ids,
    )
    torch.manual_seed(0)
    with device:
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(EMBEDDING_SCALE)
        model.model.norm.weight.mul_(LOGIT_STD / (EMBEDDING_SCALE * config.initializer_range * math.sqrt(plan.hidden)))
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return sum(p.numel() for p in model.parameters()), config.vocab_size


def with_kernel(model: Any, kernel: str) -> Any:
    model.set_attn_implementation(kernel)
    return model
