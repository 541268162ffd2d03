"""Train the shipped tool-using model: the tiny Llama of :mod:`shared.tiny_model`, taught to call ``calc``.

    python -m intellect_protocol.shared.tiny_calc --out shared/assets/tiny-calc

The calculator environment's products (:mod:`shared.environments.calculator`) are beyond a tiny model's head, but
not beyond copying: its supervised traces either call the tool (``[347*28]``, the tool's ``9716``, then ``=9716``)
or answer at once (``=9716``: a guess, for a model this size). Mostly the first where the first factor is below
500, mostly the second elsewhere (:data:`TOOL_SHARE`), so the model it makes is right about half the time: room
for reinforcement learning, which rewards only right answers, to teach it to call every time. The loss covers the model's tokens only, never the tool's. Deterministic:
a fixed seed on one CPU thread; accuracy is measured on held-out problems by the node's own episode runner, greedy,
with the environment answering. Writes the model, a character-level tokenizer and ``training.json``.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from intellect_protocol.shared.environments.calculator import Calculator, evaluate, make_problem
from intellect_protocol.shared.environments.registry import Problem, completion_text
from intellect_protocol.shared.environments.turns import Rules
from intellect_protocol.shared.episodes import run_episodes
from intellect_protocol.shared.models import encode_prompt
from intellect_protocol.shared.schemas import SamplingParams
from intellect_protocol.shared.tiny_model import build_model, build_tokenizer, save_trained, supervised_step, training_bar
from intellect_protocol.shared.torch_backend import TorchBackend

CHARS = list("0123456789+*=:[]abcdefghijklmnopqrstuvwxyz")
MAX_TOKENS = 32
"""A task's completion limit: ``[347*28]9716=9716`` and EOS is 18."""
TOOL_SHARE = {True: 0.9, False: 0.2}
"""Share of supervised traces that call the tool, for products whose first factor is below 500 and for the rest: a
greedy model calls for the first kind and guesses the second, while sampling still calls for the second now and
then, which is what reinforcement learning needs to learn from."""


def trace(rng: random.Random, prompt: str) -> list[tuple[str, bool]]:
    """A supervised completion for ``prompt`` as (text, written by the model) parts."""
    expression = prompt.rstrip(":")
    value = evaluate(expression)
    if rng.random() < TOOL_SHARE[int(expression[0]) < 5]:
        return [(f"[{expression}]", True), (value, False), (f"={value}", True)]
    return [(f"={value}", True)]


def _batch(tokenizer: PreTrainedTokenizerBase, rng: random.Random, size: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.full((size, width), tokenizer.pad_token_id)
    labels = torch.full((size, width), -100)
    for row in range(size):
        prompt, _ = make_problem(rng)
        sequence = encode_prompt(tokenizer, prompt)
        learned: list[bool] = [False] * len(sequence)
        for text, by_model in trace(rng, prompt):
            part = tokenizer.encode(text, add_special_tokens=False)
            sequence += part
            learned += [by_model] * len(part)
        sequence.append(tokenizer.eos_token_id)
        learned.append(True)
        ids[row, : len(sequence)] = torch.tensor(sequence)
        labels[row, : len(sequence)] = torch.where(torch.tensor(learned), torch.tensor(sequence), -100)
    return ids, labels


def episode_accuracy(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, problems: list[Problem]) -> tuple[float, float]:
    """(share answered right, share that called the tool) of greedy episodes on ``problems``, the environment answering."""
    environment = Calculator()
    rules = Rules(environment.stops, environment.max_turns, environment.max_reply_tokens, MAX_TOKENS)
    backend = TorchBackend(model, tokenizer.eos_token_id, tokenizer.pad_token_id)
    rows = [(encode_prompt(tokenizer, p.prompt), i, p) for i, p in enumerate(problems)]
    episodes = run_episodes(backend, tokenizer, environment, rows, SamplingParams(temperature=0, max_tokens=MAX_TOKENS), rules)
    texts = [completion_text(tokenizer, c.tokens) for c, _ in episodes]
    right = sum(environment.task_reward(t, p) for t, p in zip(texts, problems))
    called = sum(not all(flags) for _, flags in episodes)
    return right / len(problems), called / len(problems)


def train(out: Path, seed: int, steps: int, batch_size: int, lr: float) -> dict[str, Any]:
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    rng = random.Random(seed)
    tokenizer = build_tokenizer(CHARS)
    model = build_model(tokenizer)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    # Traces are drawn afresh, so a few may be of these problems too: what is learned is the call and the copy, not
    # the products.
    held_out = Calculator().problems()[-200:]
    start = time.monotonic()
    with training_bar() as progress:
        task = progress.add_task("training", total=steps)
        for _ in range(steps):
            model.train()
            loss = supervised_step(model, optimizer, *_batch(tokenizer, rng, batch_size, 8 + MAX_TOKENS))
            progress.update(task, advance=1, description=f"training  loss {loss:.3f}")
    model.eval()
    accuracy, called = episode_accuracy(model, tokenizer, held_out)
    report = {
        "seed": seed,
        "steps": steps,
        "batch_size": batch_size,
        "tool_share_of_traces": {"first factor below 500": TOOL_SHARE[True], "others": TOOL_SHARE[False]},
        "held_out_greedy_accuracy": accuracy,
        "held_out_tool_calls": called,
        "parameters": sum(p.numel() for p in model.parameters()),
        "train_seconds": round(time.monotonic() - start, 1),
    }
    save_trained(model, tokenizer, out, report)
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "assets" / "tiny-calc")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-3)
    args = parser.parse_args()
    print(json.dumps(train(args.out, args.seed, args.steps, args.batch_size, args.lr), indent=2))


if __name__ == "__main__":
    main()
