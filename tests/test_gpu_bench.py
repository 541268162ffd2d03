"""``bench/gpu.py`` runs on CPU as it runs on a GPU (``--device cpu --small``), so the one command prepared for
a lent GPU machine never rots between the rare days one is lent."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_gpu_bench_runs_every_part_on_cpu(tmp_path: Path) -> None:
    out = tmp_path / "gpu.json"
    run = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "gpu.py"), "--device", "cpu", "--small", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    parts = json.loads(out.read_text())
    assert not [name for name, figures in parts.items() if "error" in figures], run.stdout[-3000:]
    assert parts["noise"]["identical_to_cpu"] is True
    honest = parts["honest"]
    assert honest["totals"]["rows"] == 96
    assert honest["totals"]["rejected_rows"] == 0, honest["reasons"]
    assert set(honest["by_node_batch"]) == {"1", "8", "64"}
    # Files are checked by both attention kernels, at prefill batches other than the node's.
    assert {config.split("/")[1] for config in honest["by_validator"]} == {"sdpa", "eager"}
    forged = parts["forgeries"]
    # A row sampled with another seed is not the seeded draw: the file is refused, whatever the numerics.
    assert forged["another seed"]["files"] == 1 and forged["another seed"]["accepted"] == 0
    assert forged["logprob -89 on one token a row"]["accepted"] == 0
    assert parts["grpo"]["loss_finite"] is True and parts["grpo"]["rows"] == 64
    throughput = parts["throughput"]
    assert [(batch, figures["rows"]) for batch, figures in throughput["by_node_batch"].items()] == [("64", 64)]
    assert throughput["proofs_verified"] == throughput["proofs"] == 64
    assert "validator prefill / node generation" in run.stdout.splitlines()[-1]


def test_logit_precision_bench_compares_both_heads_on_cpu() -> None:
    run = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "logit_precision.py"), "--device", "cpu", "--small", "--rows", "16"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    lines = run.stdout.splitlines()
    figures = {
        line.split()[0]: [float(x.rstrip("%")) for x in line.split()[1:]] for line in lines if line.split()[0] in ("bf16", "fp32")
    }
    assert set(figures) == {"bf16", "fp32"}
    for flips, difference, kept in figures.values():
        # Two attention kernels at two batch sizes in bf16 never agree exactly, nor disagree on most draws.
        assert 0 < difference < 1 and 0 <= flips < 200 and 0 < kept <= 100
    assert lines[-1].startswith("flips with the bf16 head / with the fp32 head:")
