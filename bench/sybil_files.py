"""What a sybil's forged file costs a validator, against what it cost before the probe (round four, item 8).

A sybil uploads a file whose every completion is random tokens, proven with one prefill of the real model
(:func:`devnet.adversary.forge`: TOPLOC alone would pass it). The validator prefills a file's two shortest
rows first and stops at the first forged row (:attr:`CheckSettings.probe_rows`); before, it prefilled every row.
On the same files, in one process and one torch thread, for the shipped tiny model and a random Llama of 6 layers /
hidden 768: validator seconds per forged file and per honest file, with the probe and without it (the baseline,
measured before and after, and refused if the two differ by more than half). The ratios are printed last.

    python bench/sybil_files.py [--files 6] [--prompts 4] [--samples 4] [--tokens 48]
"""

from __future__ import annotations

import argparse
import hashlib
import tempfile
import time
from pathlib import Path

import torch
from _models import random_llama
from _tasks import arithmetic_task

from intellect_protocol.devnet.adversary import forge
from intellect_protocol.node.work import finish, generate
from intellect_protocol.shared.environments.registry import get_environment
from intellect_protocol.shared.models import TINY_MODEL_DIR, load_model
from intellect_protocol.shared.schemas import TaskSpec
from intellect_protocol.validator.checks import CheckSettings, Context, validate

PROBE = CheckSettings(prefill_batch=64)
FULL = CheckSettings(prefill_batch=64, probe_rows=0)


def seconds_per_file(files: list[tuple[TaskSpec, bytes]], model_path: str, settings: CheckSettings, accepted: bool) -> float:
    model, tokenizer = load_model(model_path)
    environment = get_environment("arithmetic")
    problems = {p.id: p for p in environment.problems()}
    start = time.perf_counter()
    for task, data in files:
        ctx = Context(task, hashlib.sha256(data).hexdigest(), 0, 0, model, tokenizer, environment, problems)
        verdict = validate(data, ctx, settings)
        assert verdict.accepted == accepted, verdict.reason
    return (time.perf_counter() - start) / len(files)


def measure(name: str, model_path: str, args: argparse.Namespace) -> tuple[float, float]:
    """(forged file's cost with the probe over without, honest file's likewise) on ``model_path``."""
    tasks = [
        arithmetic_task(i, model_path, 1.0, args.tokens, args.prompts, args.samples, stop_on_eos=False) for i in range(args.files)
    ]
    honest = [(t, finish(generate(t)).data) for t in tasks]
    forged = [(t, forge(t)) for t in tasks]
    full_before = seconds_per_file(forged, model_path, FULL, accepted=False)
    probe = seconds_per_file(forged, model_path, PROBE, accepted=False)
    full_after = seconds_per_file(forged, model_path, FULL, accepted=False)
    if max(full_before, full_after) > 1.5 * min(full_before, full_after):
        raise SystemExit(f"{name}: the baseline moved from {full_before:.3f} to {full_after:.3f} s a file (a busy machine?)")
    honest_full, honest_probe = (seconds_per_file(honest, model_path, s, accepted=True) for s in (FULL, PROBE))
    full = (full_before + full_after) / 2
    print(
        f"{name:<22} forged file {full:7.3f} s -> {probe:7.3f} s with the probe; "
        f"honest file {honest_full:7.3f} s -> {honest_probe:7.3f} s",
        flush=True,
    )
    return probe / full, honest_probe / honest_full


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=6)
    parser.add_argument("--prompts", type=int, default=4, help="prompts per task")
    parser.add_argument("--samples", type=int, default=4, help="samples per prompt")
    parser.add_argument("--tokens", type=int, default=48, help="tokens generated per sample")
    args = parser.parse_args()
    torch.set_num_threads(1)
    ratios = {"tiny-arith": measure("tiny-arith (0.86 M)", str(TINY_MODEL_DIR), args)}
    with tempfile.TemporaryDirectory() as tmp:
        ratios["6 x 768"] = measure("random Llama 6 x 768", random_llama(Path(tmp)), args)
    print(
        "validator time with the probe over without: "
        + "; ".join(f"{name}: forged file {f:.2f}x, honest file {h:.2f}x" for name, (f, h) in ratios.items())
    )


if __name__ == "__main__":
    main()
