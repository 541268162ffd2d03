"""Settings precedence: constructor (CLI flags) over INTELLECT_* env vars over the TOML file."""

from __future__ import annotations

from pathlib import Path

import pytest

from intellect_protocol.coordinator.settings import CoordinatorSettings

pytestmark = pytest.mark.unit


def test_precedence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "intellect-coordinator.toml").write_text("heartbeat_interval_s = 3.5\nrate_limit_burst = 7\n")
    assert CoordinatorSettings().heartbeat_interval_s == 3.5
    monkeypatch.setenv("INTELLECT_HEARTBEAT_INTERVAL_S", "2")
    assert CoordinatorSettings().heartbeat_interval_s == 2
    assert CoordinatorSettings(heartbeat_interval_s=1).heartbeat_interval_s == 1
    assert CoordinatorSettings().rate_limit_burst == 7


def test_bad_values_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INTELLECT_HEARTBEAT_INTERVAL_S", "-1")
    with pytest.raises(ValueError):
        CoordinatorSettings()
