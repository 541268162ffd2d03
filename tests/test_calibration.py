"""`intellect-validator calibrate`: honest work on a model, generated as nodes generate it in each dtype,
measured against a validator's recomputation; the measurements order as numerics say they must."""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from intellect_protocol.shared.environments.registry import get_environment
from intellect_protocol.shared.models import encode_prompt, load_model
from intellect_protocol.shared.schemas import SamplingParams
from intellect_protocol.shared.tolerances import TOLERANCES
from intellect_protocol.validator.calibration import flip_scale, measure
from intellect_protocol.validator.cli import app

pytestmark = pytest.mark.unit


def test_the_flip_scale_predicts_the_deviations_it_was_fitted_to() -> None:
    runner_up = torch.tensor([0.0, 0.001, 0.002, 0.01, 0.5, float("inf")])
    for deviations in (1, 2):
        s = flip_scale(runner_up, deviations)
        assert s is not None and math.isclose(float((torch.exp(-runner_up / s) / 2).sum()), deviations, rel_tol=1e-6)
    assert flip_scale(runner_up, 0) is None


def test_honest_work_measures_within_the_tolerances_the_shipped_model_was_fitted_on() -> None:
    torch.set_num_threads(1)
    model, tokenizer = load_model()
    problems = get_environment("arithmetic").problems()
    prompts = [encode_prompt(tokenizer, p.prompt) for p in problems[:32]]
    params = SamplingParams(temperature=1.0, max_tokens=24)
    fp32, bf16 = (measure(model, tokenizer, prompts, dtype, params) for dtype in ("float32", "bfloat16"))
    for m in (fp32, bf16):
        assert m.rows == 32 and m.tokens > 32 * 10 and m.rejected_rows == 0
        assert m.fitted(2.0)["logprob_abs"] == pytest.approx(2 * m.logprob_abs)
    # Recomputed in its own dtype, fp32 work differs only by kernel order; bf16 work by bf16 rounding, far more.
    assert fp32.logprob_max_error < 1e-3 < bf16.logprob_max_error
    assert fp32.file_bias <= bf16.file_bias


def test_the_command_writes_what_it_measured(tmp_path: Path) -> None:
    out = tmp_path / "calibration.json"
    done = subprocess.run(
        ["intellect-validator", "calibrate", "--rows", "16", "--max-tokens", "8", "--dtype", "bfloat16", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    written = json.loads(out.read_text())
    assert [(d["engine"], d["dtype"]) for d in written["measured"]] == [("torch", "bfloat16")] and list(
        written["tolerances"]
    ) == ["torch/bfloat16"]
    for d in written["measured"]:
        assert d["rows"] == 16 and d["rejected_rows"] == 0 and set(d["fitted"]) >= {"max_gap", "logprob_bias"}
        # The run's tolerances: the floors, widened to what was measured wherever that is wider.
        bound, floor = written["tolerances"][f"torch/{d['dtype']}"], TOLERANCES[d["dtype"]]
        assert bound["max_gap"] == max(floor.max_gap, d["fitted"]["max_gap"]) and bound["outliers"] == floor.outliers
    for args, said in ((["--dtype", "int8"], "Unknown dtype int8"), (["--engine", "cuda"], "Unknown engine cuda")):
        bad = CliRunner().invoke(app, ["calibrate", *args])
        assert bad.exit_code == 2 and said in bad.output, bad.output
