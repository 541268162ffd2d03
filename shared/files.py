"""Files that are either wholly written or not there: what a crash leaves is the old version or the new one."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO


def write_atomic_with(path: Path, write: Callable[[BinaryIO], object]) -> None:
    """Replace ``path`` with what ``write`` puts into a file object: written beside it, flushed to
    disk, then renamed over it, and the rename itself flushed (the directory entry)."""
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def write_atomic(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data``, atomically (see :func:`write_atomic_with`)."""
    write_atomic_with(path, lambda f: f.write(data))
