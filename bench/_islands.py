"""Island processes meeting through a real torchft lighthouse, for ``bench/islands.py`` and ``bench/pretrain.py``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import torch


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
