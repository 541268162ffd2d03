"""Train the embedded default model: a tiny Llama that half-learns column addition.

    python -m intellect_protocol.shared.tiny_model --out shared/assets/tiny-arith

or, with ``--family``, a model of a real family (``qwen3``, ``llama``, ... as transformers names
them) of ``--layers`` x ``--hidden`` with a byte-level BPE tokenizer of ``--bpe-vocab`` tokens
trained here, on the same text, with a chat template (the text has about 2,200 tokens' worth of
merges: the model's vocabulary is padded beyond them); ``--max-steps`` trains it briefly, so its
distributions are peaked as a real model's are (``bench/verification.py --model``).

Supervised learning on the arithmetic environment's scratchpads, from scratch, with a fixed
seed on one CPU thread, stopping as soon as greedy accuracy on held-out problems reaches
``--target`` (default 0.6), so reinforcement learning has room to improve it. Writes
safetensors + config + a character-level tokenizer, loadable offline with transformers
(:func:`shared.models.load_model`). Takes a few minutes on one core; the run's figures are
saved next to the weights in ``training.json``.
"""

from __future__ import annotations

import argparse
import json
import random
import threading
import time
from pathlib import Path
from typing import Any

import torch
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
)

from intellect_protocol.shared.environments.arithmetic import held_out_problems, make_problem, reward, scratchpad
from intellect_protocol.shared.evaluation import greedy_decode
from intellect_protocol.shared.models import encode_prompt

SPECIALS = ["<pad>", "<bos>", "<eos>"]
CHARS = list("0123456789+:=;c")
MAX_LEN = 56


def build_tokenizer(chars: list[str] = CHARS) -> PreTrainedTokenizerFast:
    """A character-level tokenizer of ``chars`` after the special tokens."""
    vocab = {token: i for i, token in enumerate(SPECIALS + chars)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>")


BPE_SPECIALS = ["<pad>", "<bos>", "<eos>", "<|user|>", "<|assistant|>", "<|system|>", "<think>", "</think>"]
# Qwen3-style: ``enable_thinking=False`` opens and closes an empty thinking block for the model.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{{ '<|' + m['role'] + '|>' + m['content'] }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}"
    "{% if enable_thinking is defined and not enable_thinking %}{{ '<think></think>' }}{% endif %}{% endif %}"
)


def bpe_tokenizer(vocab_size: int, texts: int = 2000, seed: int = 0) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained on ``texts`` arithmetic prompts and scratchpads, with a chat
    template (fewer than ``vocab_size`` tokens when the text has no more merges to make)."""
    rng = random.Random(seed)
    corpus = []
    for _ in range(texts):
        prompt, _ = make_problem(rng)
        corpus.append(prompt + scratchpad(prompt))
    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=BPE_SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    core.train_from_iterator(corpus, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>", chat_template=CHAT_TEMPLATE
    )


def family_model(
    family: str, tokenizer: PreTrainedTokenizerFast, layers: int, hidden: int, vocab_size: int = 0
) -> PreTrainedModel:
    """A randomly initialised ``family`` model (transformers' own config class) of ``layers`` x ``hidden``,
    64-wide heads, grouped KV and an untied head. ``vocab_size`` above the tokenizer's pads the
    embedding and head with rows no text uses, as Qwen's 151,936 do over its tokenizer's 151,665."""
    heads = max(1, hidden // 64)
    config = AutoConfig.for_model(
        family,
        vocab_size=max(vocab_size, len(tokenizer)),
        hidden_size=hidden,
        intermediate_size=3 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 2),
        head_dim=64,
        max_position_embeddings=MAX_LEN * 4,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model: PreTrainedModel = AutoModelForCausalLM.from_config(config)
    return model


def build_model(tokenizer: PreTrainedTokenizerFast, positions: int = MAX_LEN * 2) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=positions,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
    )
    return LlamaForCausalLM(config)


def prompt_ids(tokenizer: PreTrainedTokenizerBase, prompt: str) -> list[int]:
    return encode_prompt(tokenizer, prompt)


def _batch(tokenizer: PreTrainedTokenizerFast, rng: random.Random, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.full((size, MAX_LEN), tokenizer.pad_token_id)
    labels = torch.full((size, MAX_LEN), -100)
    for row in range(size):
        prompt, _ = make_problem(rng)
        head = prompt_ids(tokenizer, prompt)
        tail = tokenizer.encode(scratchpad(prompt), add_special_tokens=False) + [tokenizer.eos_token_id]
        sequence = head + tail
        ids[row, : len(sequence)] = torch.tensor(sequence)
        labels[row, len(head) : len(sequence)] = torch.tensor(tail)  # loss on the completion only
    return ids, labels


def greedy_completions(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, prompts: list[str], stop: threading.Event | None = None
) -> list[str]:
    """Each prompt's greedy completion (as :func:`prompt_ids` renders it) within the model's context
    (:func:`shared.evaluation.greedy_decode`)."""
    heads = [prompt_ids(tokenizer, p) for p in prompts]
    return greedy_decode(model, tokenizer, heads, max(MAX_LEN - max(map(len, heads)), 8), stop)


def greedy_accuracy(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    problems: list[tuple[str, int]],
    stop: threading.Event | None = None,
) -> float:
    """Fraction of problems whose greedy completion ends with the right answer (see :func:`greedy_completions`)."""
    texts = greedy_completions(model, tokenizer, [p for p, _ in problems], stop)
    return sum(reward(text, answer) for text, (_, answer) in zip(texts, problems)) / len(problems)


def train(
    out: Path,
    seed: int,
    target: float,
    max_steps: int,
    batch_size: int,
    eval_every: int,
    family: tuple[str, int, int, int] | None = None,
    lr: float = 3e-3,
) -> dict[str, Any]:
    """``family``: (model type, layers, hidden, BPE vocabulary) instead of the tiny Llama."""
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    rng = random.Random(seed)
    held_rng = random.Random(seed + 1)
    stopping_set = [make_problem(held_rng) for _ in range(128)]  # decides when training stops; held_out_problems() reports

    if family is None:
        tokenizer = build_tokenizer()
        model: PreTrainedModel = build_model(tokenizer)
    else:
        model_type, layers, hidden, vocab = family
        tokenizer = bpe_tokenizer(vocab, texts=20_000)
        model = family_model(model_type, tokenizer, layers, hidden, vocab)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    start, accuracy, step = time.monotonic(), 0.0, 0
    with training_bar() as progress:
        task = progress.add_task("training", total=max_steps)
        for step in range(1, max_steps + 1):
            model.train()
            loss = supervised_step(model, optimizer, *_batch(tokenizer, rng, batch_size))
            progress.update(task, advance=1, description=f"training  loss {loss:.3f}  held-out acc {accuracy:.2f}")
            # Accuracy jumps quickly once the carries click: look closely near the target.
            if step % (eval_every if accuracy < target / 2 else max(1, eval_every // 5)) == 0:
                model.eval()
                accuracy = greedy_accuracy(model, tokenizer, stopping_set)
                progress.console.log(f"step {step}: loss {loss:.3f}, held-out greedy accuracy {accuracy:.3f}")
                if accuracy >= target:
                    break
    model.eval()
    report = {
        "model_type": model.config.model_type,
        "tokenizer_size": len(tokenizer),
        "vocab_size": model.config.vocab_size,
        "seed": seed,
        "steps": step,
        "batch_size": batch_size,
        "held_out_greedy_accuracy": greedy_accuracy(model, tokenizer, held_out_problems()),
        "stopped_at_accuracy": accuracy,
        "parameters": sum(p.numel() for p in model.parameters()),
        "train_seconds": round(time.monotonic() - start, 1),
    }
    save_trained(model, tokenizer, out, report)
    return report


def training_bar() -> Progress:
    """The progress bar the training scripts show: what is said, a bar, steps done of all, time spent."""
    return Progress(
        TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn()
    )


def supervised_step(model: PreTrainedModel, optimizer: torch.optim.Optimizer, ids: torch.Tensor, labels: torch.Tensor) -> float:
    """One step on next-token loss where ``labels`` are not -100; the loss."""
    loss = model(input_ids=ids, labels=labels).loss
    optimizer.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    return float(loss.item())


def save_trained(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, out: Path, report: dict[str, Any]) -> None:
    """The model and tokenizer in ``out``, loadable offline, with the training's figures in ``training.json``."""
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    (out / "training.json").write_text(json.dumps(report, indent=2) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "assets" / "tiny-arith")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--target", type=float, default=0.6, help="stop at this held-out greedy accuracy")
    parser.add_argument("--max-steps", type=int, default=20000)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--eval-every", type=int, default=25)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--family", help="a transformers model type (qwen3, llama, mistral, ...) instead of the tiny Llama")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--bpe-vocab", type=int, default=4096)
    args = parser.parse_args()
    family = (args.family, args.layers, args.hidden, args.bpe_vocab) if args.family else None
    report = train(args.out, args.seed, args.target, args.max_steps, args.batch_size, args.eval_every, family, args.lr)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
