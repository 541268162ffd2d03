"""How many nodes one validator keeps up with: validation tokens/s against generation tokens/s.

For each model (the tiny one, and a random-init Llama of 6 layers / hidden 768 with the tiny
tokenizer), in one run and one torch thread: nodes' work (:func:`node.work.generate` then
:func:`finish`, batched tasks of arithmetic prompts) timed as generation, then the validator's
every check (:func:`validator.checks.validate`: parse, assignment, termination, one batched
prefill, TOPLOC, seeded sampling, rewards) on the same files. The ratio is printed last.

    python bench/validation.py [--tasks 6] [--prompts 4] [--samples 4] [--tokens 48]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch
from _honest_files import made_and_checked
from _models import random_llama
from _tasks import arithmetic_task

from intellect_protocol.shared.models import TINY_MODEL_DIR


def measure(name: str, model_path: str, args: argparse.Namespace) -> float:
    tasks = [
        arithmetic_task(i, model_path, 1.0, args.tokens, args.prompts, args.samples, stop_on_eos=False)
        for i in range(args.tasks + 1)
    ]
    costs = made_and_checked(tasks, model_path, "arithmetic")
    generated, checked = costs.generated / costs.generate_s, costs.generated / costs.check_s  # the same tokens
    print(
        f"{name:<30} generation {generated:8.0f} tok/s   validation {checked:8.0f} tok/s   "
        f"one validator keeps up with {checked / generated:5.1f} nodes"
    )
    return checked / generated


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=6)
    parser.add_argument("--prompts", type=int, default=4, help="prompts per task")
    parser.add_argument("--samples", type=int, default=4, help="samples per prompt")
    parser.add_argument("--tokens", type=int, default=48, help="tokens generated per sample")
    args = parser.parse_args()
    torch.set_num_threads(1)
    tiny = measure("tiny-arith (0.86 M)", str(TINY_MODEL_DIR), args)
    with tempfile.TemporaryDirectory() as tmp:
        larger = measure("random Llama 6 x 768", random_llama(Path(tmp)), args)
    print(f"ratio validation / generation tokens/s (target >= 5 on CPU): tiny {tiny:.1f}x, 6 x 768 {larger:.1f}x")


if __name__ == "__main__":
    main()
