"""A role's stop (a node's, a validator's) begins on SIGTERM whichever of its threads the kernel hands the signal to."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.unit

# The main thread sleeps in a wait no signal ends; the signal goes to another thread, as the kernel
# may choose. Python would run the handler on the main thread only, and that thread never wakes.
PROBE = """
import os, signal, threading
from intellect_protocol.shared.cli import on_any_thread

def begin_stop():
    print("stop begun", flush=True)
    os._exit(0)

signal.signal(signal.SIGTERM, lambda *_: None)
on_any_thread(begin_stop)
threading.Thread(target=lambda: signal.pthread_kill(threading.get_ident(), signal.SIGTERM)).start()
held = threading.Lock()
held.acquire()
held.acquire()
"""


def test_a_signal_taken_by_another_thread_still_begins_the_stop() -> None:
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60)
    assert (out.returncode, out.stdout.strip()) == (0, "stop begun"), out.stderr
