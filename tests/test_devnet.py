"""The README's main command: `intellect-devnet` brings up a coordinator and nodes, then stops cleanly."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from sqlalchemy import create_engine, text


def test_devnet_runs_and_stops_by_itself(tmp_path: Path) -> None:
    result = subprocess.run(
        ["intellect-devnet", "--nodes", "2", "--duration", "15", "--heartbeat-interval", "0.5", "--workdir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["exit_codes"]["node-0"] == 0 and summary["exit_codes"]["node-1"] == 0
    engine = create_engine(f"sqlite:///{tmp_path / 'ledger.db'}")
    with engine.connect() as connection:
        reached = connection.execute(text("SELECT DISTINCT address FROM node_status_events WHERE to_status = 'healthy'")).all()
    # Nodes stop before the coordinator, so they may end unhealthy; each must have been healthy.
    assert len(reached) == 2
    for name in ("coordinator", "node-0", "node-1"):
        assert (tmp_path / "logs" / f"{name}.log").exists()
    assert "Registered" in (tmp_path / "logs" / "node-0.log").read_text()
    with engine.connect() as connection:
        submitted = connection.execute(text("SELECT count(*) FROM submissions")).scalar()
    assert submitted >= 1  # the nodes did real work: leased, generated, proved, uploaded
    assert any((tmp_path / "blobs").rglob("*.parquet"))
