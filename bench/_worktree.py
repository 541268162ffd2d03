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
    try:
        yield namespace(tree, tree.parent / f"{tree.name}-path")
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=True)


def namespace(tree: Path, into: Path) -> Path:
    """``into``, holding an ``intellect_protocol`` folder of links to ``tree``'s folders, as setup.py maps them:
    with ``into`` on ``sys.path``, ``intellect_protocol.*`` imports ``tree``'s code, installed or not."""
    package = into / "intellect_protocol"
    package.mkdir(parents=True)
    for folder in FOLDERS:
        (package / folder).symlink_to(tree / folder)
    return into


def checkout(tree: Path, into: Path) -> Path:
    """:func:`namespace`, with the package's metadata as ``pip install`` writes it (name, version, the entry
    points of pyproject.toml): a checkout run where the package cannot be built (a machine without the network
    for its build tools) then finds its environment plugins by their entry points, as an installed one does."""
    import tomllib

    project = tomllib.loads((tree / "pyproject.toml").read_text())["project"]
    info = namespace(tree, into) / "intellect_protocol-0.0.0+checkout.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: 0.0.0+checkout\n")
    groups = project.get("entry-points", {}).items()
    (info / "entry_points.txt").write_text("".join(f"[{g}]\n" + "".join(f"{k} = {v}\n" for k, v in e.items()) for g, e in groups))
    return into
