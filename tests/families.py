"""Small models of real families, made on this machine: a config of each family from transformers
(``AutoConfig.for_model``), random weights from a seed, and a byte-level BPE tokenizer trained
here with the ``tokenizers`` library on the arithmetic environment's text, with a chat template
(:func:`shared.tiny_model.bpe_tokenizer`).
Nothing comes from a hub; each is saved as a Hugging Face directory the roles load as any model."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from functools import cache
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast

from intellect_protocol.shared.environments.registry import plugin
from intellect_protocol.shared.schemas import SamplingParams, TaskSpec
from intellect_protocol.shared.tiny_model import bpe_tokenizer

# head_dim 32: the smallest vLLM's CPU attention kernels take.
SHAPE = {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4}
SHAPE |= {"num_key_value_heads": 2, "max_position_embeddings": 512}

FAMILIES: dict[str, dict[str, Any]] = {
    "llama": {"tie_word_embeddings": False},
    "qwen2": {"tie_word_embeddings": False},  # q/k/v projections with bias
    "qwen3": {"head_dim": 32, "tie_word_embeddings": True},  # per-head q/k norms
    "mistral": {"sliding_window": None, "tie_word_embeddings": False},
    # Scaled embeddings, four norms a layer, sliding and global attention layers, a tied head.
    "gemma3_text": {"head_dim": 32, "query_pre_attn_scalar": 32, "sliding_window": 32, "tie_word_embeddings": True},
}
"""Each family's ``model_type`` and what its small config sets beyond :data:`SHAPE`."""


@cache
def tokenizer(vocab_size: int = 400) -> PreTrainedTokenizerFast:
    """The training script's byte-level BPE tokenizer, with a chat template: one for every family."""
    return bpe_tokenizer(vocab_size)


def build(family: str, directory: Path, seed: int = 0, tok: PreTrainedTokenizerFast | None = None) -> Path:
    """A randomly initialised small ``family`` model and the shared tokenizer (or ``tok``), saved in ``directory``."""
    tok = tok or tokenizer()
    ids = {"bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id, "pad_token_id": tok.pad_token_id}
    config = AutoConfig.for_model(family, vocab_size=len(tok), **SHAPE, **FAMILIES[family], **ids)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():  # peaked enough that sampling is not uniform noise: honest work has near-ties and clear winners
        for parameter in model.parameters():
            if parameter.dim() > 1:
                parameter.mul_(4.0)
    model.save_pretrained(directory)
    tok.save_pretrained(directory)
    return directory


def arithmetic_task(model: Path, seed: int = 1) -> TaskSpec:
    """An arithmetic task of two prompts, four samples each, on ``model``."""
    return TaskSpec(
        task_id=f"task-{seed}",
        run_id="run-test",
        environment="arithmetic",
        environment_version=plugin("arithmetic").pin,
        model=str(model),
        prompt_ids=[f"a{seed * 2}", f"a{seed * 2 + 1}"],
        samples_per_prompt=4,
        seed=seed,
        policy_step=0,
        sampling=SamplingParams(temperature=1.0, max_tokens=24),
        length_alpha=0.0,
        target_length=1024,
        length_over_only=False,
        lease_expires_at=datetime.now(UTC) + timedelta(minutes=5),
    )
