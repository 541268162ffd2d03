"""The node's finisher process starts with its pool and is ready before the first lease."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch

from intellect_protocol.node.finishers import finisher_pool, stop_finishers, wait_ready


def _state() -> tuple[bool, int]:
    return "intellect_protocol.node.work" in sys.modules, torch.get_num_threads()


def test_the_finisher_has_loaded_the_finishing_code_before_any_task() -> None:
    pool = finisher_pool()
    try:
        assert wait_ready(pool, threading.Event())
        # Nothing from node.work was submitted: the process loaded it when it started.
        assert pool.submit(_state).result(timeout=60) == (True, 1)
    finally:
        stop_finishers(pool)


def test_waiting_for_a_busy_finisher_ends_when_the_node_is_stopped() -> None:
    pool, stop = finisher_pool(), threading.Event()
    try:
        busy = pool.submit(time.sleep, 60)  # the one finisher never comes free
        threading.Timer(0.5, stop.set).start()
        start = time.monotonic()
        assert wait_ready(pool, stop) is False
        assert time.monotonic() - start < 30 and not busy.done()
    finally:
        stop_finishers(pool)


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"  # a zombie has exited
    except FileNotFoundError:
        return False


def test_a_finisher_whose_node_is_killed_while_it_starts_exits() -> None:
    """SIGKILL leaves the node no chance to stop its finisher; killed while the finisher still imports
    torch, the finisher must not outlive it (it once did, for hours, at 500 MiB each)."""
    node = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from intellect_protocol.node.finishers import finisher_pool\n"
            "import time\npool = finisher_pool()\nprint(*pool._processes, flush=True)\ntime.sleep(120)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    finisher = int(node.stdout.readline())
    node.send_signal(signal.SIGKILL)
    node.wait()
    deadline = time.monotonic() + 60
    while _alive(finisher) and time.monotonic() < deadline:
        time.sleep(0.2)
    alive = _alive(finisher)
    if alive:
        os.kill(finisher, signal.SIGKILL)
    assert not alive
