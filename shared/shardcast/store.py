"""Steps on disk, for an origin or a relay: ``DATA_DIR/RUN/STEP/`` holds the step's files in
place, ``manifest.json`` (the signed manifest) and, on a relay, ``.held`` (one verified chunk
index per line, appended as chunks are verified, so a restart keeps them).

An origin's steps are complete by construction (the trainer wrote them before the manifest);
a relay's fill in as it verifies chunks. Waiting for chunks is asyncio: a step's event is
replaced every time a chunk lands, so waiters wake and re-check.

Retention: the newest ``keep`` steps of each run are kept; an older one is retired, and its
directory deleted once ``grace_s`` has passed and no response is still reading it.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from intellect_protocol.shared.files import write_atomic
from intellect_protocol.shared.shardcast.manifest import Manifest, SignedManifest

MANIFEST_FILE = "manifest.json"
HELD_FILE = ".held"


@dataclass(eq=False)
class Step:
    dir: Path
    signed: SignedManifest
    held: set[int]
    readers: int = 0
    retired_at: float | None = None
    _changed: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def manifest(self) -> Manifest:
        return self.signed.manifest

    @property
    def complete(self) -> bool:
        return len(self.held) == len(self.manifest.chunks)

    def chunks_for(self, file_index: int, start: int, end: int) -> list[int]:
        """Indices of the chunks of ``file_index`` overlapping bytes [start, end)."""
        return [
            i
            for i, c in enumerate(self.manifest.chunks)
            if c.file == file_index and c.offset < end and start < c.offset + c.length
        ]

    def mark_held(self, index: int) -> None:
        if index in self.held:
            return
        self.held.add(index)
        with (self.dir / HELD_FILE).open("a") as f:
            f.write(f"{index}\n")
        woken, self._changed = self._changed, asyncio.Event()
        woken.set()

    async def wait_held(self, indices: list[int], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not all(i in self.held for i in indices):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            try:
                await asyncio.wait_for(self._changed.wait(), remaining)
            except TimeoutError:
                return False
        return True


class StepStore:
    def __init__(self, data_dir: Path, *, keep: int = 2, grace_s: float = 60.0, complete_on_disk: bool = False) -> None:
        """``complete_on_disk``: an origin's store, where a step with a manifest holds every chunk."""
        self.data_dir = data_dir
        self.keep = keep
        self.grace_s = grace_s
        self.complete_on_disk = complete_on_disk
        self.steps: dict[tuple[str, int], Step] = {}
        data_dir.mkdir(parents=True, exist_ok=True)
        self.scan()

    def scan(self) -> None:
        """Pick up steps written to disk (by the trainer, or before a restart)."""
        for manifest_path in self.data_dir.glob(f"*/*/{MANIFEST_FILE}"):
            signed = SignedManifest.model_validate_json(manifest_path.read_bytes())
            key = (signed.manifest.run_id, signed.manifest.step)
            if key in self.steps or manifest_path.parent != self._dir(*key):
                continue
            if self.complete_on_disk:
                held = set(range(len(signed.manifest.chunks)))
            else:
                held_path = manifest_path.parent / HELD_FILE
                lines = held_path.read_text().split() if held_path.exists() else []
                held = {int(x) for x in lines if x.isascii() and x.isdigit() and int(x) < len(signed.manifest.chunks)}
            self.steps[key] = Step(manifest_path.parent, signed, held)

    def _dir(self, run_id: str, step: int) -> Path:
        return self.data_dir / run_id / str(step)

    def get(self, run_id: str, step: int) -> Step | None:
        found = self.steps.get((run_id, step))
        return None if found is None or found.retired_at is not None and self._expired(found) else found

    def add(self, signed: SignedManifest) -> Step:
        """Make room for a step a relay is about to fetch: preallocated files, the manifest, nothing held."""
        manifest = signed.manifest
        key = (manifest.run_id, manifest.step)
        if key in self.steps:
            return self.steps[key]
        step_dir = self._dir(*key)
        preallocate(manifest, step_dir)
        (step_dir / HELD_FILE).touch()
        write_atomic(step_dir / MANIFEST_FILE, signed.model_dump_json().encode())
        self.steps[key] = step = Step(step_dir, signed, set())
        return step

    def _expired(self, step: Step) -> bool:
        return step.retired_at is not None and time.monotonic() - step.retired_at >= self.grace_s

    def prune(self) -> list[tuple[str, int]]:
        """Retire steps beyond the newest ``keep`` per run; delete retired ones past the grace
        period that nobody is reading. Returns the deleted keys."""
        by_run: dict[str, list[int]] = {}
        for run_id, step in self.steps:
            by_run.setdefault(run_id, []).append(step)
        now = time.monotonic()
        for run_id, steps in by_run.items():
            for number in sorted(steps)[: -self.keep]:
                old = self.steps[(run_id, number)]
                if old.retired_at is None:
                    old.retired_at = now
        deleted = [key for key, s in self.steps.items() if self._expired(s) and s.readers == 0]
        for key in deleted:
            shutil.rmtree(self.steps.pop(key).dir, ignore_errors=True)
        return deleted


def preallocate(manifest: Manifest, directory: Path) -> None:
    """Every file of ``manifest`` under ``directory`` at its final size, so chunks land at their offsets."""
    directory.mkdir(parents=True, exist_ok=True)
    for entry in manifest.files:
        path = directory / entry.path
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("ab") as f:
            f.truncate(entry.size)


def held_map(step: Step) -> dict[str, object]:
    return {
        "run_id": step.manifest.run_id,
        "step": step.manifest.step,
        "chunks": len(step.manifest.chunks),
        "held": sorted(step.held),
    }
