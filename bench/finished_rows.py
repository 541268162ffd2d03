"""What a node saves by letting rows that finished leave the decode batch, on long reasoning.

The ``reasoning`` workload's tasks (``tiny-reason`` on long sums, 4 prompts x 8 samples a task, answers of 170 to
370 tokens) generated as a node does (:func:`node.work.generate_with`, torch backend, one thread), against a
baseline that decodes every row to its task's longest, as the backend did before (a finished row was fed padding
to the end): the same tasks, seeds and rows, with the end-of-sequence stop off and the limit set to the longest
completion the node's run made. Both do the same model work per row and step; the baseline does more steps.
Runs alternate, ``--repeats`` each; the medians' ratio is printed last. A row-step costs either about the same
(the baseline's batches are bigger, its rows' contexts longer: 0.95-1.03x the node's rate here), so a baseline
below :data:`SLOWEST` of the node's rate was slowed by something else, and no ratio is printed.

    python bench/finished_rows.py [--tasks 6] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
from _single_process import tasks
from learning import WORKLOADS
from transformers import PreTrainedTokenizerBase

from intellect_protocol.node.work import generate_with
from intellect_protocol.shared.models import load_model
from intellect_protocol.shared.schemas import TaskSpec
from intellect_protocol.shared.torch_backend import TorchBackend

SLOWEST = 0.8
"""The least share of the node's row-steps a second the baseline may run at before its figure is refused."""


def reasoning_tasks(count: int) -> list[TaskSpec]:
    """``count`` tasks of the ``reasoning`` workload's run, seeded 1000, 1001, ... so every run draws the same rows."""
    with tempfile.TemporaryDirectory() as tmp:
        source = tasks(Path(tmp), WORKLOADS["reasoning"].run_options)
        return [next(source).model_copy(update={"seed": 1000 + i}) for i in range(count)]


def decode(
    backend: TorchBackend, tokenizer: PreTrainedTokenizerBase, specs: list[TaskSpec]
) -> tuple[float, list[list[list[int]]]]:
    """Seconds to generate ``specs`` one after another, and each task's completions (token ids)."""
    started = time.perf_counter()
    completions = [[c.tokens for c in generate_with(backend, tokenizer, spec).completions] for spec in specs]
    return time.perf_counter() - started, completions


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=6, help="tasks a run generates (default 6)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each, alternating (default 3)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    specs = reasoning_tasks(args.tasks + 1)
    model, tokenizer = load_model(specs[0].model)
    backend = TorchBackend(model, tokenizer.eos_token_id, tokenizer.pad_token_id)
    decode(backend, tokenizer, specs[:1])  # the first call in a process is slower (allocator, page faults)
    specs = specs[1:]
    lengths = [list(map(len, rows)) for rows in decode(backend, tokenizer, specs)[1]]
    to_longest = [
        spec.model_copy(update={"sampling": spec.sampling.model_copy(update={"stop_on_eos": False, "max_tokens": max(rows)})})
        for spec, rows in zip(specs, lengths, strict=True)
    ]
    tokens = sum(map(sum, lengths))
    steps = {"node": tokens, "baseline": sum(len(rows) * max(rows) for rows in lengths)}
    seconds: dict[str, list[float]] = {"node": [], "baseline": []}
    for _ in range(args.repeats):
        seconds["node"].append(decode(backend, tokenizer, specs)[0])
        seconds["baseline"].append(decode(backend, tokenizer, to_longest)[0])
    median = {name: statistics.median(times) for name, times in seconds.items()}
    rates = {name: steps[name] / median[name] for name in steps}
    print(f"{args.tasks} tasks, {sum(map(len, lengths))} rows, {tokens} tokens; {args.repeats} runs each")
    for name in ("baseline", "node"):
        print(f"{name:>9}: {median[name]:6.2f} s median ({min(seconds[name]):.2f}-{max(seconds[name]):.2f}),")
        print(f"{'':>9}  {steps[name]} row-steps, {rates[name]:,.0f} row-steps/s, {tokens / median[name]:,.0f} tokens/s")
    if rates["baseline"] < SLOWEST * rates["node"]:
        raise SystemExit(
            f"the baseline ran {rates['baseline'] / rates['node']:.2f}x the node's row-steps a second: slowed, no ratio"
        )
    print(f"node / baseline, tokens/s: {median['baseline'] / median['node']:.2f}x")


if __name__ == "__main__":
    main()
