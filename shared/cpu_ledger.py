"""Where a process's CPU time goes, by activity: the ledger ``bench/learning.py`` prices the
protocol's tax with.

``with spent("proof"):`` charges the CPU time the calling thread spends inside the block to
``proof``. A block inside another is charged to the inner activity only, so activities add up to
no more than the process's CPU time; what no block covers (imports, servers, idle loops) is the
difference, read as "other".

Recording is on only when ``INTELLECT_CPU_LEDGER`` names a directory when the process starts
(or after :func:`record`). The process then writes ``<dir>/<pid>.json`` (:class:`Snapshot`) every
second and at exit, so a reader can difference two snapshots to price a window of the run. Off, a
block costs one branch.
Thread CPU time is exact only when torch runs its ops in the calling thread (one thread per
process, as every role runs).

A snapshot credits a block still open with its CPU time so far: a training step or a task's generation runs for
many seconds, and a window that ends inside one would otherwise read its work as "other".
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel

LEDGER_ENV = "INTELLECT_CPU_LEDGER"
FLUSH_S = 1.0


class Snapshot(BaseModel):
    """One process's CPU seconds so far."""

    pid: int
    parent: int
    """The parent's pid: a helper process (a node's finisher) is charged to the role that started it."""
    program: str
    cpu_s: float
    """Every thread's user and system time (``time.process_time``)."""
    activities: dict[str, float]
    """Thread CPU seconds inside ``spent`` blocks, by activity."""


_directory: Path | None = None
_clock = time.thread_time
_totals: defaultdict[str, float] = defaultdict(float)
_lock = threading.Lock()
_started = False
_exiting = threading.Event()


@dataclass
class _Open:
    """A block not yet left: its activity, the clock when it began and the time of the blocks it held that ended."""

    activity: str
    began: float
    nested: float = 0.0


_open: dict[int, tuple[Callable[[], float], list[_Open]]] = {}
"""Each thread's blocks not yet left, outermost first, with a reader of that thread's clock from any thread."""


@contextmanager
def spent(activity: str) -> Iterator[None]:
    """Charge the calling thread's CPU time inside the block to ``activity`` (when recording)."""
    if _directory is None:
        yield
        return
    _start()
    thread = threading.get_ident()
    with _lock:
        if thread not in _open:  # the thread's outermost block: its clock's reader is made once
            _open[thread] = (_reader(), [])
        read, stack = _open[thread]
        block = _Open(activity, read())
        stack.append(block)
    try:
        yield
    finally:
        with _lock:
            elapsed = read() - block.began
            stack.pop()
            _totals[activity] += elapsed - block.nested
            if stack:
                stack[-1].nested += elapsed
            else:
                del _open[thread]


def _reader() -> Callable[[], float]:
    """The calling thread's clock, readable from another thread (the flusher reads open blocks)."""
    if _clock is not time.thread_time:
        return _clock
    clock = time.pthread_getcpuclockid(threading.get_ident())
    return lambda: time.clock_gettime(clock)


def record(directory: Path, clock: Callable[[], float] = time.thread_time) -> None:
    """Record this process from now on, writing to ``directory`` (a role reads ``LEDGER_ENV`` at
    import instead). ``clock``: ``time.process_time`` charges a block with the work of the threads
    it hands work to (torch's intra-op pool), right only where one flow of work runs at a time."""
    global _directory, _clock
    directory.mkdir(parents=True, exist_ok=True)
    _directory, _clock = directory, clock


def snapshot() -> Snapshot:
    """This process's CPU seconds so far, as :func:`read_ledgers` returns them."""
    with _lock:
        activities = defaultdict(float, _totals)
        for read, stack in _open.values():
            now, inside = read(), 0.0  # inside: the open block within this one, counted already
            for block in reversed(stack):
                elapsed = now - block.began
                activities[block.activity] += elapsed - block.nested - inside
                inside = elapsed
    return Snapshot(
        pid=os.getpid(),
        parent=os.getppid(),
        program=Path(sys.argv[0]).name,
        cpu_s=time.process_time(),
        activities=dict(activities),
    )


def _start() -> None:
    global _started
    with _lock:
        if _started:
            return
        _started = True
    flusher = threading.Thread(target=_flush, name="cpu-ledger", daemon=True)
    atexit.register(_last_write, flusher)
    flusher.start()


def _flush() -> None:
    while not _exiting.is_set():
        _write()
        _exiting.wait(FLUSH_S)


def _last_write(flusher: threading.Thread) -> None:
    # The flusher finishes its write first: a daemon thread still writing as the interpreter finalizes can crash it.
    _exiting.set()
    flusher.join()
    _write()


def _write() -> None:
    """The snapshot, into the directory recording goes to now (:func:`record` may have moved it)."""
    directory = _directory
    if directory is None:
        return
    path = directory / f"{os.getpid()}.json"
    partial = path.with_suffix(".partial")
    try:
        partial.write_text(snapshot().model_dump_json())
    except FileNotFoundError:
        return  # the directory is gone: whoever read the ledger has finished (made anew, it would outlive them)
    os.replace(partial, path)  # a reader never sees half a file


def read_ledgers(directory: Path) -> list[Snapshot]:
    """Every process's latest snapshot in ``directory``."""
    return [Snapshot.model_validate(json.loads(p.read_text())) for p in sorted(directory.glob("*.json"))]


if os.environ.get(LEDGER_ENV):
    record(Path(os.environ[LEDGER_ENV]))
