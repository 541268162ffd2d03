"""The node's finisher process starts with its pool and is ready before the first lease."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch

from intellect_protocol.node.finishers import finisher_pool, stop_finishers, wait_ready

ROOT = Path(__file__).parent.parent


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


FORKED = """
import signal, sys, threading, time
from intellect_protocol.node.finishers import finisher_pool, stop_finishers, wait_ready
from tests.test_finishers import _state

signal.signal(signal.SIGTERM, lambda *_: None)  # as a node's own handler would
pool = finisher_pool()
print(pool._mp_context.get_start_method(), pool.submit(_state).result(timeout=60)[0], flush=True)
assert wait_ready(pool, threading.Event())
print(*pool.submit(_state).result(timeout=60), flush=True)
(pid,) = pool._processes
print(open(f"/proc/{pid}/cmdline").read().strip("\\0"), flush=True)
pool.submit(time.sleep, 60)  # busy when stopped
started = time.monotonic()
stop_finishers(pool)
print(round(time.monotonic() - started), flush=True)
"""


def test_a_process_with_one_thread_forks_its_finisher_which_loads_only_when_asked_and_stops_at_once() -> None:
    done = subprocess.run([sys.executable, "-c", FORKED], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    forked, ready, title, stopped = done.stdout.splitlines()
    assert forked == "fork False" and ready == "True 1"
    assert re.fullmatch(r"intellect-node finisher \(node \d+\)", title), title  # not its node's command line
    # Its node's SIGTERM handler is not the finisher's: terminating it does not wait for the minute's task.
    assert int(stopped) < 30


def test_a_process_running_another_thread_spawns_its_finisher() -> None:
    stop = threading.Event()
    threading.Thread(target=stop.wait, daemon=True).start()
    try:
        pool = finisher_pool()
        assert pool._mp_context.get_start_method() == "spawn"  # type: ignore[attr-defined]
        stop_finishers(pool)
    finally:
        stop.set()
