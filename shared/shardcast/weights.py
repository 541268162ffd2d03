"""The policy weights a role computes with (a node generating, a validator checking).

Step 0 is the run's base model; step N > 0 comes through shardcast into
``STATE_DIR/weights/RUN/N`` (verified chunk by chunk, resumable), and the directory is what
the inference backend loads. The newest two steps of each run are kept, and any older one a
task is still using."""

from __future__ import annotations

import shutil
import threading
import time
from collections import Counter
from pathlib import Path

from rich.console import Console

from intellect_protocol.shared.coordinator_client import CoordinatorClient
from intellect_protocol.shared.schemas import TaskSpec
from intellect_protocol.shared.shardcast.client import download_step
from intellect_protocol.shared.shardcast.store import MANIFEST_FILE

KEEP = 2


class Weights:
    def __init__(self, api: CoordinatorClient, directory: Path, console: Console) -> None:
        """``api`` fetches manifests and reports bad relays (signed by its account)."""
        self.api = api
        self.directory = directory
        self.console = console
        self.lock = threading.Lock()
        self.held: dict[str, int] = {}
        """Per run, the newest step held: what heartbeats report."""
        self.runs: set[str] = set()
        """Runs this process has worked on: the ones worth prefetching new steps of."""
        self.fetching: set[tuple[str, int]] = set()
        self.pinned: Counter[tuple[str, int]] = Counter()
        """(run, step) -> tasks using it now: never pruned."""
        for run_dir in directory.glob("*"):
            steps = [
                int(p.parent.name)
                for p in run_dir.glob(f"*/{MANIFEST_FILE}")
                if p.parent.name.isascii() and p.parent.name.isdigit()
            ]
            if steps:
                self.held[run_dir.name] = max(steps)

    def model_for(self, task: TaskSpec, *, pin: bool = False) -> str:
        """The model directory for the task's policy step, downloading it first if it is not here yet.

        ``pin``: keep that step on disk, whatever newer steps arrive, until :meth:`unpin` for the
        task (a node generates on one thread and finishes and uploads on others, while prefetches prune).
        """
        self.runs.add(task.run_id)
        return task.model if task.policy_step == 0 else str(self.ensure(task.run_id, task.policy_step, pin=pin))

    def unpin(self, task: TaskSpec) -> None:
        if task.policy_step == 0:
            return
        with self.lock:
            self.pinned[(task.run_id, task.policy_step)] -= 1
            self.pinned += Counter()  # drops the zeros

    def ensure(self, run_id: str, step: int, *, pin: bool = False) -> Path:
        dest = self.directory / run_id / str(step)
        with self.lock:
            if not (dest / MANIFEST_FILE).exists():
                self._download(run_id, step, dest)
            if pin:
                self.pinned[(run_id, step)] += 1
            self.held[run_id] = max(self.held.get(run_id, 0), step)
            self._prune(run_id, step)
        return dest

    def prefetch(self, run_id: str, step: int) -> None:
        """Fetch ``step`` in the background (once), so the task that needs it finds it ready and
        generation never waits for a download; only for runs this process works on."""
        if run_id not in self.runs or step <= self.held.get(run_id, 0) or (run_id, step) in self.fetching:
            return
        self.fetching.add((run_id, step))

        def fetch() -> None:
            try:
                self.ensure(run_id, step)
            except Exception as e:  # the task that needs the step fetches it again and reports the failure
                self.console.print(f"[yellow]Prefetching policy step {step} of {run_id} failed: {e}[/yellow]")
            finally:
                self.fetching.discard((run_id, step))

        threading.Thread(target=fetch, name=f"prefetch-{step}", daemon=True).start()

    def _download(self, run_id: str, step: int, dest: Path) -> None:
        # Plain lines, not a progress bar: downloads run beside the node's own live status line.
        started = time.monotonic()
        manifest = download_step(self.api, run_id, step, dest)
        rate = manifest.total_bytes / 2**20 / max(time.monotonic() - started, 1e-6)
        self.console.print(
            f"Holding policy step {step} of {run_id} ({manifest.total_bytes / 2**20:.1f} MiB verified, {rate:.0f} MiB/s)."
        )

    def _prune(self, run_id: str, wanted: int) -> None:
        """Keep the newest KEEP steps, the pinned ones and ``wanted`` (the step being handed out, which
        may be older than those: a validator works through a backlog of older policy steps)."""
        steps = sorted(
            (int(p.name) for p in (self.directory / run_id).glob("*") if p.name.isascii() and p.name.isdigit()), reverse=True
        )
        for old in steps[KEEP:]:
            if old == wanted or (run_id, old) in self.pinned:
                continue  # pruned by a later call, once its tasks are done
            shutil.rmtree(self.directory / run_id / str(old), ignore_errors=True)
