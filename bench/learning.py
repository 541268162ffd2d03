"""The whole network learning, for a fixed wall-clock budget: asynchronous (level 2) against
synchronous (level 0) RL, in the same run.

Each configuration starts a fresh devnet (coordinator, origin, relay, validator, trainer, one
node: separate processes on loopback) and lets it run for ``--seconds``. Afterwards every
published policy step (or an even sample of them) is evaluated on the same held-out
arithmetic problems (greedy accuracy), placed in time by its manifest's registration. Printed:
each accuracy curve, the gain over the shipped model, and the wall-clock each configuration
needed to reach the accuracy both reach, as a ratio (sync / async).

    python bench/learning.py [--seconds 300] [--evals 12]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from datetime import datetime
from pathlib import Path

import httpx
import torch

from devnet.network import start_network
from shared.models import load_model
from shared.shardcast.origin import step_dir
from shared.tiny_model import greedy_accuracy, held_out

RUN = ["--prompts-per-task", "4", "--samples-per-prompt", "8", "--max-tokens", "64"]


def curve(async_level: int, seconds: float, evals: int, held_out: list[tuple[str, int]]) -> list[tuple[float, int, float]]:
    """(seconds since start, step, held-out accuracy) for the steps published within ``seconds``."""
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        net = start_network(workdir, nodes=1, run_options=[*RUN, "--async-level", str(async_level)], keep_steps=100_000)
        started = time.time()
        try:
            while time.time() - started < seconds:
                for process in net.processes:
                    if process.popen.poll() is not None:
                        raise RuntimeError(f"{process.name} exited:\n{process.tail()}")
                time.sleep(1)
            url = net.coordinator.url
            reply = httpx.get(f"{url}/v1/manifests/{net.run_id}/latest")
            latest = reply.json()["step"] if reply.status_code == 200 else 0
            published = {}
            for step in range(1, latest + 1):
                created = httpx.get(f"{url}/v1/manifests/{net.run_id}/{step}").json()["created_at"]
                published[step] = datetime.fromisoformat(created).timestamp() - started
        finally:
            net.stop()
        chosen = sorted({round(i * latest / evals) for i in range(1, evals + 1)} - {0}) if latest else []
        base, tokenizer = load_model("tiny-arith")
        points = [(0.0, 0, greedy_accuracy(base, tokenizer, held_out))]
        for step in chosen:
            model, _ = load_model(step_dir(workdir / "origin", net.run_id, step))
            points.append((published[step], step, greedy_accuracy(model, tokenizer, held_out)))
        return points


def time_to(points: list[tuple[float, int, float]], accuracy: float) -> float:
    return next((t for t, _, a in points if a >= accuracy), float("inf"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=300, help="wall-clock budget of each configuration")
    parser.add_argument("--evals", type=int, default=12, help="policy steps evaluated per configuration")
    args = parser.parse_args()
    torch.set_num_threads(1)
    problems = held_out()
    curves = {level: curve(level, args.seconds, args.evals, problems) for level in (2, 0)}
    for level, points in curves.items():
        shown = "  ".join(f"{t:5.0f}s/step {s}: {a:.3f}" for t, s, a in points)
        print(f"async level {level}: {shown}")
        print(f"  gain over the shipped model: {100 * (points[-1][2] - points[0][2]):+.1f} points (target >= +10) in {args.seconds:.0f} s")
    common = min(max(a for _, _, a in points) for points in curves.values())
    async_s, sync_s = time_to(curves[2], common), time_to(curves[0], common)
    print(f"time to reach {common:.3f} held-out accuracy: async {async_s:.0f} s, sync {sync_s:.0f} s; ratio sync / async {sync_s / max(async_s, 1e-9):.2f}x")


if __name__ == "__main__":
    main()
