"""`intellect-devnet` never destroys an earlier run's results, and a start that fails says why in
one message and leaves its summary, without a traceback."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from intellect_protocol.devnet.cli import app as devnet_cli
from intellect_protocol.devnet.network import RUN_NAME
from intellect_protocol.devnet.processes import create_run, migrate


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() if p.is_file() else b"" for p in sorted(folder.rglob("*"))}


@pytest.mark.unit
@pytest.mark.parametrize("left", ["summary.json", "ledger.db", "admin-token", "logs"])
def test_a_workdir_holding_an_earlier_devnet_is_refused_and_left_untouched(left: str, tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir() if left == "logs" else (tmp_path / left).write_text("an earlier run's\n")
    before = _snapshot(tmp_path)
    result = CliRunner().invoke(devnet_cli, ["--workdir", str(tmp_path), "--steps", "1"], terminal_width=240)
    assert result.exit_code == 1, result.output
    assert "holds an earlier devnet" in result.output and left in result.output and "--workdir" in result.output
    assert _snapshot(tmp_path) == before


@pytest.mark.unit
def test_a_calibration_that_cannot_judge_the_nodes_is_refused_before_anything_starts(tmp_path: Path) -> None:
    calibration, workdir = tmp_path / "calibration.json", tmp_path / "devnet"
    for written, says in (
        ("{not json", "not a calibration file"),
        ('{"tolerances": {"vllm/bfloat16": {}}}', "no tolerances for the nodes' numerics, torch/float32"),
    ):
        calibration.write_text(written)
        result = CliRunner().invoke(
            devnet_cli, ["--calibration", str(calibration), "--workdir", str(workdir)], terminal_width=240
        )
        assert result.exit_code == 1 and says in result.output, result.output
        assert not workdir.exists()


@pytest.mark.unit
def test_islands_without_their_extra_are_refused_before_anything_starts(tmp_path: Path, monkeypatch) -> None:
    """Round four of use: without the [islands] extra, every role started and then a torchft ModuleNotFoundError."""
    monkeypatch.setitem(sys.modules, "torchft", None)  # the extra not installed (find_spec finds nothing)
    workdir = tmp_path / "devnet"
    result = CliRunner().invoke(devnet_cli, ["--islands", "2", "--workdir", str(workdir)], terminal_width=240)
    assert result.exit_code == 1, result.output
    assert "pip install 'intellect-protocol[islands]'" in result.output and "Traceback" not in result.output
    assert not workdir.exists()


@pytest.mark.unit
def test_a_model_without_its_tokenizer_files_is_refused_naming_them(tmp_path: Path) -> None:
    """A Qwen3 config alone made an empty tokenizer, and the nodes died on "empty prompt" after the roles started."""
    from transformers import AutoConfig

    model, workdir = tmp_path / "model", tmp_path / "devnet"
    AutoConfig.for_model("qwen3", vocab_size=500, hidden_size=64, intermediate_size=128, num_hidden_layers=1).save_pretrained(
        model
    )
    result = CliRunner().invoke(devnet_cli, ["--model", str(model), "--workdir", str(workdir)], terminal_width=240)
    assert result.exit_code == 1, result.output
    assert "tokenizer of" in result.output and "lacks its tokenizer files (tokenizer.json" in result.output, result.output
    assert not workdir.exists()


def test_a_chain_devnet_without_anvil_says_how_to_install_it_and_nothing_else(tmp_path: Path) -> None:
    workdir = tmp_path / "new" / "devnet"  # not there yet: the devnet makes it
    # Only the interpreter's own folder on PATH: no anvil.
    env = {**os.environ, "PATH": str(Path(sys.executable).parent)}
    result = subprocess.run(
        [str(shutil.which("intellect-devnet")), "--chain", "--workdir", str(workdir)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert "npm install -g @foundry-rs/anvil@1.7.1" in output and "Traceback" not in output, output
    assert (workdir / "summary.json").exists()


def test_a_ledger_holding_an_earlier_devnet_run_is_refused_before_anything_is_added(tmp_path: Path) -> None:
    ledger = tmp_path / "shared.db"
    url = f"sqlite:///{ledger}"
    migrate(url, tmp_path / "migrate.log")
    create_run(url, RUN_NAME, tmp_path / "run.log")
    before = ledger.read_bytes()
    command = ["intellect-devnet", "--workdir", str(tmp_path / "devnet"), "--database-url", url]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert "already holds an earlier devnet's run" in output and "--database-url" in output and "Traceback" not in output
    assert ledger.read_bytes() == before


def _running(*words: str) -> bool:
    """Whether a process of ours runs with every one of ``words`` in its command line."""
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if all(any(w in a for a in args) for w in words):
            return True
    return False


def test_ctrl_c_while_calibrating_exits_non_zero_and_leaves_the_workdir_reusable(tmp_path: Path) -> None:
    """Round four of use: Ctrl-C during --model calibration exited 0 and left a workdir the next start refused."""
    from intellect_protocol.devnet.preflight import earlier_devnet
    from intellect_protocol.shared.models import TINY_MODEL_DIR

    workdir = tmp_path / "devnet"
    command = [str(shutil.which("intellect-devnet")), "--model", str(TINY_MODEL_DIR), "--workdir", str(workdir)]
    devnet = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while not _running("calibrate", str(workdir)):
            assert devnet.poll() is None and time.monotonic() < deadline, devnet.communicate()[0]
            time.sleep(0.05)
        devnet.send_signal(signal.SIGINT)
        output = devnet.communicate(timeout=60)[0]
    finally:
        devnet.kill()
    assert devnet.returncode == 130, output
    assert "Interrupted before the network started; nothing was kept" in output and "Traceback" not in output, output
    assert list(workdir.iterdir()) == [] and earlier_devnet(workdir) == []
    assert not _running("calibrate", str(workdir))  # the calibration stopped with it
