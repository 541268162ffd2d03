"""Helper processes that end with the process that started them.

A process killed with SIGKILL cannot stop its helpers, and a pool worker waits on a queue it holds
both ends of, so it would wait forever (500 MiB each, for a finisher with torch loaded). Each pool
worker runs :func:`exit_with` first, as its initializer or the first line of one.
"""

from __future__ import annotations

import os
import threading
import time


def exit_with(parent: int) -> None:
    """End this process once ``parent`` (the pid that started it, passed in, never read here:
    after a parent's death the process that adopts us is the parent we would read) is gone."""
    threading.Thread(target=_watch, args=(parent,), name="exit-with-parent", daemon=True).start()


def _watch(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(0)
