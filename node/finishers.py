"""The node's prove stage: a process that finishes tasks (rewards, proofs, the file) beside generation.

On a small model generation is bound by Python, so in a thread the same work would wait for the GIL.
The node makes its pool as it starts, before it opens a connection or starts a thread, so on Linux the
finisher is forked: it begins with whatever the node has imported (a node forked warm by the devnet has
torch and transformers already) instead of an interpreter that imports them anew, seconds of CPU. A
process that already runs threads gets a spawned finisher instead: a lock another thread holds would be
copied into the fork half-taken. The finisher loads the finishing code (torch, the proof code) only
when :func:`wait_ready` asks, once there is a run to work for, while the node loads its model code; the
first lease waits until it has. This module imports neither torch nor the finishing code, so the node's
own imports and the finisher's overlap.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import threading
from concurrent.futures import Executor, ProcessPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

import setproctitle

from intellect_protocol.shared.orphans import exit_with


def finisher_pool() -> ProcessPoolExecutor:
    """A pool of one finisher, already started: forked where this is the process's only thread (on Linux),
    spawned otherwise."""
    forked = sys.platform == "linux" and threading.active_count() == 1
    context = multiprocessing.get_context("fork" if forked else "spawn")
    pool = ProcessPoolExecutor(max_workers=1, mp_context=context, initializer=_start, initargs=(os.getpid(),))
    pool.submit(os.getpid)  # a pool starts its process at the first submission
    return pool


def wait_ready(pool: Executor, stop: threading.Event, poll_s: float = 0.2) -> bool:
    """Wait until ``pool``'s finisher has loaded the finishing code (True), or until ``stop`` is set (False)."""
    ready = pool.submit(_load)
    while not stop.is_set():
        try:
            ready.result(timeout=poll_s)
            return True
        except FutureTimeout:
            continue
    return False


def stop_finishers(pool: ProcessPoolExecutor) -> None:
    """Shut ``pool`` down now: work in it is dropped with its task (the lease runs out), and a
    finisher still loading (importing torch can take seconds on a busy machine) is not waited for."""
    for process in list(pool._processes.values()):  # no public way before Python 3.14
        process.terminate()
    pool.shutdown(wait=True, cancel_futures=True)


def _start(node: int) -> None:
    exit_with(node)  # first: a node SIGKILLed at any time after this must not leave this process behind
    # Ctrl-C at a terminal reaches the whole process group; stopping the finisher is its node's call.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # A forked finisher inherits its node's handlers; :func:`stop_finishers` ends it with SIGTERM.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.set_wakeup_fd(-1)
    # Forked, it would show its node's command line in ``ps``: the node's own would be found twice.
    setproctitle.setproctitle(f"intellect-node finisher (node {node})")


def _load() -> None:
    import torch

    from intellect_protocol.node import work  # noqa: F401  (loaded now, not with the first task's lease running)

    torch.set_num_threads(1)
