"""The CPU ledger: a block's thread CPU time goes to its activity, a nested block's to the inner one
only, other threads' work to no block of this one; the file a process writes is what a reader
differences."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from intellect_protocol.shared.cpu_ledger import LEDGER_ENV, read_ledgers, snapshot, spent

pytestmark = pytest.mark.unit

WORK = """
import threading, time
from intellect_protocol.shared.cpu_ledger import spent

def burn(seconds):
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass

with spent("outer"):
    burn(0.3)
    with spent("inner"):
        burn(0.2)
    time.sleep(0.3)  # waiting costs no CPU
with spent("outer"):
    other = threading.Thread(target=burn, args=(0.3,))  # another thread's work is not this block's
    other.start()
    other.join()
burn(0.1)  # outside every block: "other"
"""


OPEN_BLOCKS = """
import json, threading, time
from intellect_protocol.shared.cpu_ledger import snapshot, spent

def burn(seconds):
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass

inside, release = threading.Event(), threading.Event()

def work():
    with spent("outer"):
        burn(0.2)
        with spent("inner"):
            burn(0.1)
        with spent("inner"):
            burn(0.1)
            inside.set()
            release.wait()  # both blocks held open, costing no CPU

worker = threading.Thread(target=work)
worker.start()
inside.wait()
during = snapshot()
release.set()
worker.join()
print(json.dumps([during.activities, during.cpu_s, snapshot().activities]))
"""


def _run(env: dict[str, str]) -> None:
    subprocess.run([sys.executable, "-c", WORK], env={**os.environ, **env}, check=True, timeout=60)


def test_activities_are_charged_their_own_threads_cpu_time_and_nested_blocks_once(tmp_path: Path) -> None:
    _run({LEDGER_ENV: str(tmp_path)})
    (snapshot,) = read_ledgers(tmp_path)
    assert snapshot.program == "-c" and snapshot.parent == os.getpid()
    assert set(snapshot.activities) == {"outer", "inner"}
    assert 0.3 <= snapshot.activities["outer"] < 0.4
    assert 0.2 <= snapshot.activities["inner"] < 0.3
    assert snapshot.cpu_s >= 0.3 + 0.2 + 0.3 + 0.1  # the process total counts every thread
    assert snapshot.cpu_s - sum(snapshot.activities.values()) >= 0.4


def test_nothing_is_recorded_unless_asked() -> None:
    assert not os.environ.get(LEDGER_ENV)
    with spent("generation"):
        sum(range(100_000))
    assert snapshot().activities == {}
    assert not any(t.name == "cpu-ledger" for t in threading.enumerate())


def test_recording_moved_to_another_directory_writes_there(tmp_path: Path) -> None:
    """``bench/learning.py`` records its single process once per repeat, each time into a fresh directory."""
    moved = f"""
from pathlib import Path
from intellect_protocol.shared import cpu_ledger
cpu_ledger.record(Path({str(tmp_path / "first")!r}))
with cpu_ledger.spent("first"):
    sum(range(10_000))
cpu_ledger.record(Path({str(tmp_path / "second")!r}))
with cpu_ledger.spent("second"):
    sum(range(10_000))
"""
    subprocess.run([sys.executable, "-c", moved], env={**os.environ, LEDGER_ENV: ""}, check=True, timeout=60)
    (latest,) = read_ledgers(tmp_path / "second")
    assert set(latest.activities) == {"first", "second"}


def test_a_snapshot_credits_blocks_still_open_with_their_cpu_so_far(tmp_path: Path) -> None:
    """A window that ends inside a long block (a training step, a task's generation) sees its work, not "other"."""
    out = subprocess.run(
        [sys.executable, "-c", OPEN_BLOCKS],
        env={**os.environ, LEDGER_ENV: str(tmp_path)},
        check=True,
        timeout=60,
        capture_output=True,
        text=True,
    )
    during, cpu_s, after = json.loads(out.stdout)
    assert 0.2 <= during["outer"] < 0.25 and 0.2 <= during["inner"] < 0.25  # the open inner block is not the outer's
    assert cpu_s >= during["outer"] + during["inner"]
    assert after["outer"] == pytest.approx(during["outer"], abs=0.02)
    assert after["inner"] == pytest.approx(during["inner"], abs=0.02)  # once closed, nothing is counted twice
