"""Small models of real families, made on this machine: a config of each family from transformers
(``AutoConfig.for_model``), random weights from a seed, and a byte-level BPE tokenizer trained
here with the ``tokenizers`` library on the arithmetic environment's text, with a chat template.
Nothing comes from a hub; each is saved as a Hugging Face directory the roles load as any model."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from functools import cache
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast

from intellect_protocol.shared.environments.arithmetic import make_problem, scratchpad
from intellect_protocol.shared.environments.registry import plugin
from intellect_protocol.shared.schemas import SamplingParams, TaskSpec

SPECIALS = ["<pad>", "<bos>", "<eos>", "<|user|>", "<|assistant|>", "<|system|>", "<think>", "</think>"]
# Qwen3-style: ``enable_thinking=False`` opens and closes an empty thinking block for the model.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{{ '<|' + m['role'] + '|>' + m['content'] }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}"
    "{% if enable_thinking is defined and not enable_thinking %}{{ '<think></think>' }}{% endif %}{% endif %}"
)
# head_dim 32: the smallest vLLM's CPU attention kernels take.
SHAPE = {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4}
SHAPE |= {"num_key_value_heads": 2, "max_position_embeddings": 512}

FAMILIES = {
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
    """A byte-level BPE tokenizer trained on arithmetic prompts and scratchpads, with a chat template."""
    rng = random.Random(0)
    corpus = []
    for _ in range(2000):
        prompt, _ = make_problem(rng)
        corpus.append(prompt + scratchpad(prompt))
    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    core.train_from_iterator(corpus, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>", chat_template=CHAT_TEMPLATE
    )


def build(family: str, directory: Path, seed: int = 0) -> Path:
    """A randomly initialised small ``family`` model and the shared tokenizer, saved in ``directory``."""
    tok = tokenizer()
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
