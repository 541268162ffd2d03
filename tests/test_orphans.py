"""Helper processes end with the process that started them, even one killed with SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

FINISHER = """
from intellect_protocol.node.finishers import finisher_pool
pool = finisher_pool()  # killed at once: its finisher is still importing torch
print(*pool._processes, flush=True)
"""

MATH_CHECKER = """
from intellect_protocol.shared.environments.math import MathVerifier
verifier = MathVerifier()
assert verifier.reward("so \\\\boxed{4}", "4") == 1.0
print(*verifier._pool._processes, flush=True)
"""


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"  # a zombie has exited
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("owner", [FINISHER, MATH_CHECKER], ids=["node finisher", "math checker"])
def test_a_pool_worker_exits_when_its_owner_is_killed(owner: str) -> None:
    """They once did not: killed test nodes left 19 finishers on a machine, idle at 500 MiB each."""
    parent = subprocess.Popen([sys.executable, "-c", owner + "import time; time.sleep(120)"], stdout=subprocess.PIPE, text=True)
    worker = int(parent.stdout.readline())
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 30
    while _alive(worker) and time.monotonic() < deadline:
        time.sleep(0.2)
    alive = _alive(worker)
    if alive:
        os.kill(worker, signal.SIGKILL)
    assert not alive
