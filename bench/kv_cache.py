"""What a node saves by appending each step's keys and values in place (``shared.kv_cache``), on long reasoning.

The ``reasoning`` workload's tasks (``tiny-reason`` on long sums, 4 prompts x 8 samples a task, answers of 170 to
370 tokens) generated as a node does (:func:`node.work.generate_with`, torch backend, one thread), against the same
backend on transformers' ``DynamicCache``, which concatenates the whole cache at every step. Same tasks, seeds and
model: every run must draw the same tokens, or no ratio is printed. Runs alternate, ``--repeats`` each; the medians'
ratio is printed last. Both do the same model work, so a run more than :data:`SPREAD` slower than its own
configuration's fastest was slowed by something else on the machine, and no ratio is printed either.

    python bench/kv_cache.py [--tasks 6] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics

import torch
from finished_rows import decode, reasoning_tasks
from transformers import DynamicCache

from intellect_protocol.shared.models import load_model
from intellect_protocol.shared.torch_backend import TorchBackend

SPREAD = 1.25
"""The most a configuration's slowest run may take over its fastest before the machine counts as busy."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=6, help="tasks a run generates (default 6)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each, alternating (default 3)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    specs = reasoning_tasks(args.tasks + 1)
    model, tokenizer = load_model(specs[0].model)
    backends = {
        "baseline": TorchBackend(model, tokenizer.eos_token_id, tokenizer.pad_token_id, kv_cache=lambda _: DynamicCache()),
        "node": TorchBackend(model, tokenizer.eos_token_id, tokenizer.pad_token_id),
    }
    for backend in backends.values():
        decode(backend, tokenizer, specs[:1])  # the first call in a process is slower (allocator, page faults)
    specs = specs[1:]
    seconds: dict[str, list[float]] = {name: [] for name in backends}
    drawn: dict[str, list[list[list[int]]]] = {}
    for _ in range(args.repeats):
        for name, backend in backends.items():
            took, completions = decode(backend, tokenizer, specs)
            seconds[name].append(took)
            if drawn.setdefault(name, completions) != completions or drawn["baseline"] != completions:
                raise SystemExit(f"{name} drew other tokens than the baseline's first run: not the same work, no ratio")
    tokens = sum(len(row) for rows in drawn["node"] for row in rows)
    median = {name: statistics.median(times) for name, times in seconds.items()}
    print(
        f"{args.tasks} tasks, {sum(map(len, drawn['node']))} rows, {tokens} tokens, the same in every run; {args.repeats} runs each"
    )
    for name, times in seconds.items():
        print(
            f"{name:>9}: {median[name]:6.2f} s median ({min(times):.2f}-{max(times):.2f}), {tokens / median[name]:,.0f} tokens/s"
        )
    busy = [name for name, times in seconds.items() if max(times) > SPREAD * min(times)]
    if busy:
        raise SystemExit(f"{', '.join(busy)}: runs {SPREAD}x apart or more, the machine was busy: no ratio")
    print(f"node / baseline, tokens/s: {median['baseline'] / median['node']:.2f}x")


if __name__ == "__main__":
    main()
