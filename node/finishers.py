"""The node's prove stage: a process that finishes tasks (rewards, proofs, the file) beside generation.

On a small model generation is bound by Python, so in a thread the same work would wait for the GIL.
The process starts when its pool is made and imports the finishing code (torch, the proof code:
seconds) at once, while the node does its own start-up; :func:`wait_ready` holds the first lease
until it is up, so no task's lease runs while a process boots. This module imports neither torch
nor the finishing code, so the node's own imports and the finisher's overlap.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
from concurrent.futures import Executor, ProcessPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

from intellect_protocol.shared.orphans import exit_with


def finisher_pool() -> ProcessPoolExecutor:
    """A pool of one finisher, already starting."""
    pool = ProcessPoolExecutor(
        max_workers=1, mp_context=multiprocessing.get_context("spawn"), initializer=_start, initargs=(os.getpid(),)
    )
    pool.submit(os.getpid)  # a pool starts its process at the first submission
    return pool


def wait_ready(pool: Executor, stop: threading.Event, poll_s: float = 0.2) -> bool:
    """Wait until ``pool`` runs work (True), or until ``stop`` is set (False)."""
    ready = pool.submit(os.getpid)
    while not stop.is_set():
        try:
            ready.result(timeout=poll_s)
            return True
        except FutureTimeout:
            continue
    return False


def stop_finishers(pool: ProcessPoolExecutor) -> None:
    """Shut ``pool`` down now: work in it is dropped with its task (the lease runs out), and a
    finisher still starting (importing torch can take seconds on a busy machine) is not waited for."""
    for process in list(pool._processes.values()):  # no public way before Python 3.14
        process.terminate()
    pool.shutdown(wait=True, cancel_futures=True)


def _start(node: int) -> None:
    exit_with(node)  # first: a node SIGKILLed during the imports below must not leave this process behind
    # Ctrl-C at a terminal reaches the whole process group; stopping the finisher is its node's call.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    import torch

    from intellect_protocol.node import work  # noqa: F401  (loaded now, not with the first task's lease running)

    torch.set_num_threads(1)
