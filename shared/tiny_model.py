"""Train the embedded default model: a tiny Llama that half-learns column addition.

    python -m intellect_protocol.shared.tiny_model --out shared/assets/tiny-arith

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

import torch
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
    StoppingCriteria,
    StoppingCriteriaList,
)

from intellect_protocol.shared.environments.arithmetic import make_problem, reward, scratchpad
from intellect_protocol.shared.models import encode_prompt

SPECIALS = ["<pad>", "<bos>", "<eos>"]
CHARS = list("0123456789+:=;c")
MAX_LEN = 56


def build_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {token: i for i, token in enumerate(SPECIALS + CHARS)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>")


def build_model(tokenizer: PreTrainedTokenizerFast) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=MAX_LEN * 2,
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


HELD_OUT_SEED = 2024


def held_out(n: int = 200) -> list[tuple[str, int]]:
    """The held-out problems every figure of held-out accuracy is measured on (``training.json``,
    the devnet, tests and benchmarks), so the numbers they print compare."""
    rng = random.Random(HELD_OUT_SEED)
    return [make_problem(rng) for _ in range(n)]


class Stopped(Exception):
    """An evaluation given up because its ``stop`` event was set."""


class _UntilSet(StoppingCriteria):
    def __init__(self, stop: threading.Event) -> None:
        self.stop = stop

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs: object) -> torch.Tensor:
        return torch.full((input_ids.shape[0],), self.stop.is_set(), dtype=torch.bool)


@torch.inference_mode()
def greedy_completions(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, prompts: list[str], stop: threading.Event | None = None
) -> list[str]:
    """Each prompt's greedy completion (as :func:`prompt_ids` renders it), decoded as one batch with a
    KV cache: ten times faster than re-reading the prefix at every token. Prompts of unequal length
    are padded on the left, where a causal model never reads them. Raises :class:`Stopped` when
    ``stop`` is set meanwhile: a caller that is shutting down waits at most one decoding step."""
    heads = [prompt_ids(tokenizer, p) for p in prompts]
    width = max(map(len, heads))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    ids = torch.full((len(heads), width), pad)  # [prompts, width]
    mask = torch.zeros_like(ids)
    for row, head in enumerate(heads):
        ids[row, width - len(head) :] = torch.tensor(head)
        mask[row, width - len(head) :] = 1
    out = model.generate(  # type: ignore[operator]  # transformers' GenerationMixin, untyped for mypy
        ids,
        attention_mask=mask,
        max_new_tokens=max(MAX_LEN - width, 8),
        do_sample=False,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=pad,
        stopping_criteria=StoppingCriteriaList([_UntilSet(stop)]) if stop is not None else None,
    )
    if stop is not None and stop.is_set():
        raise Stopped
    return tokenizer.batch_decode(out[:, width:], skip_special_tokens=True)


def greedy_accuracy(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    problems: list[tuple[str, int]],
    stop: threading.Event | None = None,
) -> float:
    """Fraction of problems whose greedy completion ends with the right answer (see :func:`greedy_completions`)."""
    texts = greedy_completions(model, tokenizer, [p for p, _ in problems], stop)
    return sum(reward(text, answer) for text, (_, answer) in zip(texts, problems)) / len(problems)


def train(out: Path, seed: int, target: float, max_steps: int, batch_size: int, eval_every: int) -> dict:
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    rng = random.Random(seed)
    held_rng = random.Random(seed + 1)
    stopping_set = [make_problem(held_rng) for _ in range(128)]  # decides when training stops; held_out() reports

    tokenizer = build_tokenizer()
    model = build_model(tokenizer)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    start, accuracy, step = time.monotonic(), 0.0, 0
    with Progress(
        TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn()
    ) as progress:
        task = progress.add_task("training", total=max_steps)
        for step in range(1, max_steps + 1):
            model.train()
            ids, labels = _batch(tokenizer, rng, batch_size)
            loss = model(input_ids=ids, labels=labels).loss
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            progress.update(task, advance=1, description=f"training  loss {loss.item():.3f}  held-out acc {accuracy:.2f}")
            # Accuracy jumps quickly once the carries click: look closely near the target.
            if step % (eval_every if accuracy < target / 2 else max(1, eval_every // 5)) == 0:
                model.eval()
                accuracy = greedy_accuracy(model, tokenizer, stopping_set)
                progress.console.log(f"step {step}: loss {loss.item():.3f}, held-out greedy accuracy {accuracy:.3f}")
                if accuracy >= target:
                    break
    model.eval()
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    report = {
        "seed": seed,
        "steps": step,
        "batch_size": batch_size,
        "held_out_greedy_accuracy": greedy_accuracy(model, tokenizer, held_out()),
        "stopped_at_accuracy": accuracy,
        "parameters": sum(p.numel() for p in model.parameters()),
        "train_seconds": round(time.monotonic() - start, 1),
    }
    (out / "training.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "assets" / "tiny-arith")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--target", type=float, default=0.6, help="stop at this held-out greedy accuracy")
    parser.add_argument("--max-steps", type=int, default=20000)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--eval-every", type=int, default=25)
    args = parser.parse_args()
    print(json.dumps(train(args.out, args.seed, args.target, args.max_steps, args.batch_size, args.eval_every), indent=2))


if __name__ == "__main__":
    main()
