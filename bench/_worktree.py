"""The code of an earlier revision, for a benchmark's baseline measured in the same run (``--before REV``)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("shared", "coordinator", "node", "validator", "trainer", "devnet", "migrations", "contracts")


@contextmanager
def worktree(revision: str, tree: Path) -> Iterator[Path]:
    """``revision`` checked out in a git worktree at ``tree`` for the time of the block; yields the folder to put
    on ``PYTHONPATH`` so that ``intellect_protocol.*`` imports that code. setup.py maps the repository's folders
    into that namespace, and a worktree holds no ``intellect_protocol`` folder: with the worktree itself on the
    path, every import would find the installed tree instead, and the baseline would be this code."""
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), revision], check=True, capture_output=True)
    namespace = tree.parent / f"{tree.name}-path" / "intellect_protocol"
    namespace.mkdir(parents=True)
    for folder in FOLDERS:
        (namespace / folder).symlink_to(tree / folder)
    try:
        yield namespace.parent
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=True)
