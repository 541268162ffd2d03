"""`intellect-node check` before joining: whether this machine can serve each of a coordinator's runs
(its environment plugin at the pinned version, memory for its model), from estimates checked here
against what the loaded model really holds."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import pytest
import torch
from sqlalchemy import create_engine, text

from intellect_protocol.coordinator.db import make_sessionmaker
from intellect_protocol.coordinator.services.runs import create_run as new_run
from intellect_protocol.coordinator.settings import CoordinatorSettings
from intellect_protocol.devnet.processes import StartError, create_run
from intellect_protocol.node.fit import kv_cache_bytes, parameter_count
from intellect_protocol.shared.models import TINY_MODEL_DIR, load_model
from intellect_protocol.shared.run_schemas import RunSpec
from intellect_protocol.shared.schemas import DEFAULT_MODEL
from intellect_protocol.shared.tolerances import TOLERANCES
from tests import families
from tests.conftest import serve
from tests.helpers import HTTP


@pytest.mark.unit
@pytest.mark.parametrize("family", ["tiny", "qwen2", "gemma3_text"])  # tied and untied heads, biases, extra norms
def test_the_estimate_counts_what_the_loaded_model_holds(family: str, tmp_path: Path) -> None:
    directory = TINY_MODEL_DIR if family == "tiny" else families.build(family, tmp_path / family)
    model, _ = load_model(directory)
    assert parameter_count(directory) == sum(p.numel() for p in model.parameters())

    # The KV cache a forward pass really keeps, for 3 sequences of 11 tokens.
    with torch.no_grad():
        out = model(torch.ones(3, 11, dtype=torch.long), use_cache=True)
    kept = sum(t.numel() * t.element_size() for layer in out.past_key_values.layers for t in (layer.keys, layer.values))
    config = json.loads((directory / "config.json").read_text())
    assert kv_cache_bytes(config, sequences=3, tokens=11, dtype="float32") == kept


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_check_says_which_runs_this_machine_can_serve(sqlite_url: str, tmp_path: Path) -> None:
    # A model whose config claims a million layers: its KV cache fits no machine (the weights are the tiny model's).
    deep = tmp_path / "deep"
    shutil.copytree(TINY_MODEL_DIR, deep)
    config = json.loads((deep / "config.json").read_text())
    (deep / "config.json").write_text(json.dumps(config | {"num_hidden_layers": 1_000_000}))
    logs = tmp_path / "logs"
    engine = create_engine(sqlite_url)
    with make_sessionmaker(engine).begin() as session:
        for name, model in (
            ("fits", DEFAULT_MODEL),
            ("deep", str(deep)),
            ("hub", "Qwen/Qwen3-0.6B"),
            ("newer-plugin", DEFAULT_MODEL),
        ):
            new_run(session, RunSpec(name=name, model=model), datetime.now(UTC))
    # Calibrated on its model for bf16 nodes only (as `intellect-validator calibrate --dtype bfloat16 --out` writes it).
    calibration = tmp_path / "calibration.json"
    calibration.write_text(
        json.dumps({"tolerances": {"torch/bfloat16": TOLERANCES["bfloat16"].widened({"max_gap": 0.1}).model_dump()}})
    )
    create_run(sqlite_url, "bf16-only", logs / "bf16.log", ["--calibration", str(calibration)])
    calibration.write_text(json.dumps({"measured": []}))
    with pytest.raises(StartError, match="has no tolerances"):
        create_run(sqlite_url, "no-tolerances", logs / "bad.log", ["--calibration", str(calibration)])
    with engine.begin() as connection:  # as if the coordinator had a newer release of the built-in environments
        connection.execute(text("UPDATE runs SET environment_version = 'intellect-protocol==9.0' WHERE name = 'newer-plugin'"))
    engine.dispose()

    with serve(CoordinatorSettings(database_url=sqlite_url, blob_dir=tmp_path / "blobs")) as coordinator:
        published = HTTP.get(f"{coordinator.url}/v1/public/runs").json()
        checked = subprocess.run(
            ["intellect-node", "check", "--coordinator", coordinator.url, "--state-dir", str(tmp_path / "state")],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "COLUMNS": "250"},
        )
    said = " ".join(checked.stderr.split())
    assert checked.returncode == 1, checked.stdout + checked.stderr
    rows = {line.split()[2]: line for line in checked.stdout.splitlines() if line.strip().startswith(("│ ✓", "│ ✗"))}
    assert set(rows) == {"fits", "deep", "hub", "newer-plugin", "bf16-only"}, checked.stdout
    assert "✓" in rows["fits"] and "✓" in rows["hub"] and "downloaded at join" in rows["hub"]
    assert "✗" in rows["deep"] and "✗" in rows["newer-plugin"]
    assert "run deep: model " in said and "needs about" in said and "GiB of usable RAM" in said
    assert (
        "run newer-plugin: environment 'arithmetic' is intellect-protocol sha256=" in said
        and "here but the run pins intellect-protocol==9.0" in said
    )
    assert "run bf16-only: this node computes as torch/float32" in said and "admits only torch/bfloat16" in said
    assert "run fits:" not in said and "run hub:" not in said
    by_name = {run["name"]: run for run in published}
    assert by_name["bf16-only"]["tolerances"]["torch/bfloat16"]["max_gap"] == 0.1 and by_name["fits"]["tolerances"] is None
