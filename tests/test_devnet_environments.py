"""The devnet on the shipped models' own environments, as a newcomer runs it from a fresh clone (two nodes, two
validators, the real network):

- `--environment calculator`: multi-turn episodes on `tiny-calc`, the tool's answers replayed by the validators;
  the run learns to call the tool (held-out accuracy and the share of episodes with a correct call both rise);
- `--environment long-sum --budget 180`: `tiny-reason` under a short thinking budget; the share of held-out answers
  within it rises and held-out accuracy does not fall.

Each is one devnet of about a minute or two: one in each e2e group, so the stage's two workers share them."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.e2e


def devnet(workdir: Path, *options: str) -> dict[str, Any]:
    """Run the devnet with ``options`` until it stops by itself; its summary, once every role exited cleanly."""
    result = subprocess.run(
        ["intellect-devnet", *options, "--workdir", str(workdir)], capture_output=True, text=True, timeout=540
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary: dict[str, Any] = json.loads((workdir / "summary.json").read_text())
    assert set(summary["exit_codes"].values()) == {0}, summary["exit_codes"]
    files = summary["rollout_files"]
    assert files["accepted"] > 0 and files["rejected"] == 0, files
    return summary


@pytest.mark.xdist_group("e2e-b")
@pytest.mark.timeout(600)
def test_the_calculator_devnet_learns_to_use_the_tool(tmp_path: Path) -> None:
    summary = devnet(tmp_path / "devnet", "--environment", "calculator", "--steps", "12")
    assert summary["policy_step"] == 12
    # Measured here: 0.29 -> 0.85 accuracy and 0.415 -> 1.0 episodes with a correct call, in two runs.
    assert summary["accuracy_after"] >= summary["accuracy_before"] + 0.2, summary["accuracy_by_step"]
    calls = summary["tool_calls_by_step"]
    assert calls[max(calls, key=int)] > calls["0"] + 0.2, calls
    assert summary["accuracy_measured_on"].startswith("calculator: ")


@pytest.mark.xdist_group("e2e-a")
@pytest.mark.timeout(600)
def test_the_long_sum_devnet_learns_its_thinking_budget(tmp_path: Path) -> None:
    summary = devnet(tmp_path / "devnet", "--environment", "long-sum", "--budget", "180", "--steps", "1")
    assert summary["policy_step"] == 1
    # Measured here: within budget 0.25 -> 0.81 and 0.835, accuracy 0.545 -> 0.69 and 0.60, in two runs.
    within = summary["within_budget_by_step"]
    assert within["1"] >= within["0"] + 0.3, within
    assert summary["accuracy_after"] >= summary["accuracy_before"] - 0.05, summary["accuracy_by_step"]
