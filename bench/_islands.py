"""Island processes meeting through a real torchft lighthouse, for ``bench/islands.py`` and ``bench/pretrain.py``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

LINK_BYTES_PER_S = 1e9 / 8
"""The projection's link: 1 Gbit/s."""
BIG_PARAMETERS = 7e9
BIG_INNER_STEP_S = 3.4
"""A 7B model's inner step, assumed: 256 completions of 1,000 tokens (6 x 7e9 x 256k = 1.1e19 FLOPs) on 8
H100s at 40 % of their 989 dense bf16 TFLOP/s."""


def big_all_reduce_s(islands: int) -> float:
    """Seconds a meeting of ``islands`` 7B islands takes over 1 Gbit/s: a bf16 ring all-reduce of one slot an island
    (every island receives every pseudo-gradient, to judge what was sent)."""
    return 2 * (islands - 1) / islands * 2 * BIG_PARAMETERS * islands / LINK_BYTES_PER_S


def run_island_processes(script: str, islands: int, min_islands: int, arguments: list[str], out: Path) -> list[Any]:
    """Run ``islands`` processes of ``script`` (each with ``--island-index I --lighthouse URL --out OUT`` and
    ``arguments``) against a lighthouse of their own; what each saved as ``OUT/island-I.pt``, once all exited."""
    from torchft._torchft import LighthouseServer

    # One island is a quorum: an island that stops first (the clocks' last milliseconds) leaves the other going.
    # A run that steps only with several islands waits longer for them to join each meeting.
    join_ms = 1000 if min_islands == 1 else 5000
    lighthouse = LighthouseServer(bind="127.0.0.1:0", min_replicas=1, join_timeout_ms=join_ms, heartbeat_timeout_ms=1000)
    address = "http://127.0.0.1:" + lighthouse.address().rsplit(":", 1)[1]
    children = [
        subprocess.Popen(
            [sys.executable, script, "--island-index", str(i), "--lighthouse", address, "--out", str(out), *arguments],
            stderr=open(out / f"island-{i}.log", "wb"),  # noqa: SIM115  (the child owns it)
        )
        for i in range(islands)
    ]
    for i, child in enumerate(children):
        if child.wait() != 0:
            raise SystemExit(f"island {i} failed:\n" + (out / f"island-{i}.log").read_text()[-3000:])
    lighthouse.shutdown()
    return [torch.load(out / f"island-{i}.pt", weights_only=False) for i in range(islands)]
