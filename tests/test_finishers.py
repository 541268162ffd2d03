"""The node's finisher process starts with its pool and is ready before the first lease."""

from __future__ import annotations

import sys
import threading
import time

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
