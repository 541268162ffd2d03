"""The README's main command: `intellect-devnet` brings up every role, the run learns for a few
policy steps, and everything stops cleanly with a summary."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from sqlalchemy import create_engine, text


def test_devnet_learns_for_a_few_steps_and_stops_by_itself(tmp_path: Path) -> None:
    result = subprocess.run(
        ["intellect-devnet", "--nodes", "1", "--steps", "3", "--heartbeat-interval", "0.5", "--workdir", str(tmp_path), "--adversary"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert all(code == 0 for code in summary["exit_codes"].values()), summary["exit_codes"]
    assert set(summary["exit_codes"]) == {"coordinator", "origin", "relay", "validator", "trainer", "node-0", "adversary"}
    assert summary["policy_step"] >= 2 and summary["rollout_files"]["accepted"] >= 1 and summary["tokens_accepted"] > 0
    assert 0 < summary["accuracy_before"] <= 1 and 0 < summary["accuracy_after"] <= 1
    assert "Held-out accuracy" in result.stdout
    for name in ("coordinator", "origin", "relay", "validator", "trainer", "node-0"):
        assert (tmp_path / "logs" / f"{name}.log").exists()
    engine = create_engine(f"sqlite:///{tmp_path / 'ledger.db'}")
    with engine.connect() as connection:
        reached = connection.execute(text("SELECT DISTINCT address FROM node_status_events WHERE to_status = 'healthy'")).all()
        manifests = connection.execute(text("SELECT count(*) FROM manifests")).scalar()
    assert len(reached) == 1 and manifests >= 3
    # The cheating node uploaded forged work, and none of it was accepted.
    adversary = json.loads((tmp_path / "wallets" / "adversary.json").read_text())["address"]
    with engine.connect() as connection:
        statuses = [s for (s,) in connection.execute(text("SELECT status FROM submissions WHERE lower(address) = :a"), {"a": "0x" + adversary.lower()})]
    assert "uploaded forged rollouts" in (tmp_path / "logs" / "adversary.log").read_text()
    assert statuses and "accepted" not in statuses
