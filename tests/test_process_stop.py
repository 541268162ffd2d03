"""How the devnet stops a role: SIGTERM, then SIGKILL at the deadline, unless the role is visibly winding down
(its log still growing), which earns it time up to a cap."""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

import pytest

from intellect_protocol.devnet.processes import spawn

pytestmark = pytest.mark.integration

# Ignores SIGTERM (as a role busy finishing what it holds would, for a while), then says it is done and exits 0.
WINDING = """
import signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: print("stopping", flush=True))
print("ready", flush=True)
for i in range(int(sys.argv[1])):
    time.sleep(0.3)
    if sys.argv[2] == "talks":
        print(f"finishing item {i}", flush=True)
sys.exit(0)
"""


def _started(tmp_path: Path, name: str, steps: int, talks: str):
    script = tmp_path / "role.py"
    script.write_text(WINDING)
    process = spawn(name, [sys.executable, str(script), str(steps), talks], tmp_path / f"{name}.log")
    while "ready" not in (tmp_path / f"{name}.log").read_text():
        time.sleep(0.05)
    return process


def test_a_role_still_finishing_its_work_gets_time_and_a_silent_one_is_killed(tmp_path: Path) -> None:
    winding = _started(tmp_path, "winding", 10, "talks")  # 3 s of work, talking as it goes
    assert winding.stop(timeout=1, winding_down_s=10) == 0
    assert "finishing item 9" in (tmp_path / "winding.log").read_text()
    silent = _started(tmp_path, "silent", 100, "quiet")
    started = time.monotonic()
    assert silent.stop(timeout=1, winding_down_s=10) == -signal.SIGKILL
    assert time.monotonic() - started < 5
