"""Train the shipped reasoning model: the tiny Llama of :mod:`shared.tiny_model`, taught long column sums.

    python -m intellect_protocol.shared.tiny_reason --out shared/assets/tiny-reason

Supervised on the scratchpads of :mod:`shared.environments.long_sum`, from scratch, with a fixed seed on a fixed
number of CPU threads (``--threads``; the shipped model's are in its ``training.json``). Half the traces check
themselves (a second pass), half do not, whatever budget the prompt states (half state one, of 180 or 360 tokens):
what a budget asks is left for reinforcement learning to teach. Columns are drawn from 4 digits up, one length a
batch, so the steps are learned on short traces as well as long ones; the learning rate falls along a cosine to a
tenth, and training stops as soon as greedy accuracy on held-out columns of full length reaches ``--target``
(default 0.5), so RL has room. Writes the model, a character-level tokenizer and ``training.json`` with the run's
figures.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from intellect_protocol.shared.environments.long_sum import (
    CHECK,
    ITEMS,
    LABELS,
    MAX_TOKENS,
    budget_prompt,
    held_out_problems,
    make_problem,
    reward,
    scratchpad,
)
from intellect_protocol.shared.evaluation import greedy_tokens
from intellect_protocol.shared.models import encode_prompt
from intellect_protocol.shared.tiny_model import build_model, build_tokenizer, save_trained, supervised_step, training_bar

CHARS = sorted(set("0123456789=;:|" + CHECK + LABELS))
TRAIN_ITEMS = (4, ITEMS[1])
BUDGETS = (180, 360)
"""Budgets a supervised prompt may state: about a scratchpad without its check, and with it."""
POSITIONS = 512
"""The model's context: the longest prompt (a budget and 26 digits) and :data:`MAX_TOKENS`."""


def _trace(rng: random.Random, items: int) -> tuple[str, str]:
    prompt, _ = make_problem(rng, (items, items))
    stated = budget_prompt(prompt, rng.choice(BUDGETS)) if rng.random() < 0.5 else prompt
    return stated, scratchpad(prompt, check=rng.random() < 0.5)


def _batch(tokenizer: PreTrainedTokenizerBase, rng: random.Random, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    rows, items = [], rng.randint(*TRAIN_ITEMS)  # one column length a batch: little of it is padding
    for _ in range(size):
        prompt, completion = _trace(rng, items)
        head = encode_prompt(tokenizer, prompt)
        rows.append((head, tokenizer.encode(completion, add_special_tokens=False) + [tokenizer.eos_token_id]))
    width = max(len(head) + len(tail) for head, tail in rows)  # [batch, width]: as wide as this batch needs
    ids = torch.full((size, width), tokenizer.pad_token_id)
    labels = torch.full((size, width), -100)
    for row, (head, tail) in enumerate(rows):
        ids[row, : len(head) + len(tail)] = torch.tensor(head + tail)
        labels[row, len(head) : len(head) + len(tail)] = torch.tensor(tail)  # loss on the completion only
    return ids, labels


def held_out_figures(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, problems: list[tuple[str, int]]
) -> dict[str, float]:
    """Greedy accuracy on ``problems``, the share of completions that check themselves, and their mean length."""
    completions = greedy_tokens(model, tokenizer, [encode_prompt(tokenizer, p) for p, _ in problems], MAX_TOKENS)
    texts = tokenizer.batch_decode(completions, skip_special_tokens=True)
    lengths = [len(c) for c in completions]
    return {
        "accuracy": sum(reward(t, a) for t, (_, a) in zip(texts, problems)) / len(problems),
        "checked": sum(CHECK in t for t in texts) / len(problems),
        "mean_tokens": sum(lengths) / len(lengths),
    }


def train(
    out: Path, seed: int, target: float, max_steps: int, batch_size: int, eval_every: int, lr: float, threads: int
) -> dict[str, Any]:
    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    rng = random.Random(seed)
    stopping_rng = random.Random(seed + 1)
    stopping_set = [make_problem(stopping_rng) for _ in range(64)]  # decides when training stops
    tokenizer = build_tokenizer(CHARS)
    model = build_model(tokenizer, POSITIONS)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    # Long lookups need a small final step size: a cosine from lr to a tenth of it over max_steps.
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: 0.55 + 0.45 * math.cos(math.pi * min(i / max_steps, 1.0)))
    start, accuracy, step = time.monotonic(), 0.0, 0
    with training_bar() as progress:
        task = progress.add_task("training", total=max_steps)
        for step in range(1, max_steps + 1):
            model.train()
            loss = supervised_step(model, optimizer, *_batch(tokenizer, rng, batch_size))
            schedule.step()
            progress.update(task, advance=1, description=f"training  loss {loss:.3f}  held-out acc {accuracy:.2f}")
            if step % eval_every == 0:
                model.eval()
                accuracy = held_out_figures(model, tokenizer, stopping_set)["accuracy"]
                progress.console.log(f"step {step}: loss {loss:.3f}, held-out greedy accuracy {accuracy:.3f}")
                if accuracy >= target:
                    break
    model.eval()
    figures = held_out_figures(model, tokenizer, held_out_problems())
    report = {
        "seed": seed,
        "threads": threads,
        "steps": step,
        "batch_size": batch_size,
        "lr": lr,
        "cosine_steps": max_steps,
        "stopped_at_accuracy": accuracy,
        "held_out_greedy_accuracy": figures["accuracy"],
        "held_out_checked": figures["checked"],
        "held_out_mean_tokens": round(figures["mean_tokens"], 1),
        "parameters": sum(p.numel() for p in model.parameters()),
        "train_seconds": round(time.monotonic() - start, 1),
    }
    save_trained(model, tokenizer, out, report)
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "assets" / "tiny-reason")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--target", type=float, default=0.5, help="stop at this held-out greedy accuracy")
    parser.add_argument("--max-steps", type=int, default=2500, help="the learning rate's cosine ends here")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--eval-every", type=int, default=100)
    parser.add_argument("--lr", type=float, default=1e-3, help="AdamW's (3e-3, tiny-arith's, is unstable on these lengths)")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads; the same seed and count give the same model")
    args = parser.parse_args()
    report = train(args.out, args.seed, args.target, args.max_steps, args.batch_size, args.eval_every, args.lr, args.threads)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
