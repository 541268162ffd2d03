"""The policy weights a role computes with (a node generating, a validator checking).

Step 0 is the run's base model; step N > 0 comes through shardcast into
``STATE_DIR/weights/RUN/N`` (verified chunk by chunk, resumable), and the directory is what
the inference backend loads. The newest two steps of each run are kept."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

from eth_account.signers.local import LocalAccount
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn

from shared.schemas import TaskSpec
from shared.shardcast.client import download_step
from shared.shardcast.store import MANIFEST_FILE

KEEP = 2


class Weights:
    def __init__(self, coordinator: str, account: LocalAccount, directory: Path, console: Console) -> None:
        self.coordinator = coordinator
        self.account = account
        self.directory = directory
        self.console = console
        self.lock = threading.Lock()
        self.held: dict[str, int] = {}
        """Per run, the newest step held: what heartbeats report."""
        for run_dir in directory.glob("*"):
            steps = [int(p.parent.name) for p in run_dir.glob(f"*/{MANIFEST_FILE}") if p.parent.name.isdigit()]
            if steps:
                self.held[run_dir.name] = max(steps)

    def model_for(self, task: TaskSpec) -> str:
        """The model directory for the task's policy step, downloading it first if needed."""
        if task.policy_step == 0:
            return task.model
        dest = self.directory / task.run_id / str(task.policy_step)
        with self.lock:
            if not (dest / MANIFEST_FILE).exists():
                self._download(task.run_id, task.policy_step, dest)
            self.held[task.run_id] = max(self.held.get(task.run_id, 0), task.policy_step)
            self._prune(task.run_id)
        return str(dest)

    def _download(self, run_id: str, step: int, dest: Path) -> None:
        columns = (*Progress.get_default_columns()[:2], BarColumn(), DownloadColumn(), TransferSpeedColumn())
        with Progress(*columns, console=self.console, transient=True, disable=not self.console.is_terminal) as progress:
            bar = progress.add_task(f"policy step {step}", total=None)
            download_step(
                self.coordinator, run_id, step, dest, account=self.account,
                on_progress=lambda done, total: progress.update(bar, completed=done, total=total),
            )  # fmt: skip
        self.console.print(f"Holding policy step {step} of {run_id} (verified).")

    def _prune(self, run_id: str) -> None:
        steps = sorted((int(p.name) for p in (self.directory / run_id).glob("*") if p.name.isdigit()), reverse=True)
        for old in steps[KEEP:]:
            shutil.rmtree(self.directory / run_id / str(old), ignore_errors=True)
