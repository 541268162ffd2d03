"""A validator's audits of pretraining islands (:mod:`coordinator.services.island_audits`): replay the outer step a
run drew, from the published weights its inner steps started from, on the slots the island reported in the order it reported them, and
send how far what the island sent is from the replay. The coordinator judges it against the run's tolerance.

An audit whose starting weights no relay serves now is left for later (or for another validator); nothing is lost.
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

import torch
from eth_account.signers.local import LocalAccount
from rich.console import Console
from transformers import AutoModelForCausalLM, PreTrainedModel

from intellect_protocol.shared.coordinator_client import CoordinatorClient, Refused
from intellect_protocol.shared.island_audit_schemas import MAX_ERROR, IslandAuditInfo, IslandAuditTask, IslandAuditVerdict
from intellect_protocol.shared.pretraining.audit import Verdict, judge, replay
from intellect_protocol.shared.pretraining.corpus import fetch_shard
from intellect_protocol.shared.pretraining.settings import PretrainSettings
from intellect_protocol.shared.run_schemas import RunInfo
from intellect_protocol.shared.shardcast.client import DownloadError
from intellect_protocol.shared.shardcast.weights import Weights


class IslandAuditor:
    def __init__(
        self, api: CoordinatorClient, account: LocalAccount, weights: Weights, state_dir: Path, console: Console
    ) -> None:
        """``weights`` fetches the published steps audits start from; shards are kept under ``state_dir``."""
        self.api, self.account, self.weights, self.console = api, account, weights, console
        self.shards = state_dir / "shards"
        self.runs: dict[str, RunInfo] = {}

    def audit_open(self, limit: int = 4) -> int:
        """Replay up to ``limit`` open audits this validator has not judged and post each verdict; how many were posted."""
        posted = 0
        for task in self.api.island_audits(limit):
            try:
                info = self.audit(task)
            except DownloadError as e:
                self.console.print(
                    f"[yellow]island audit {task.id}: policy step {task.start_step} could not be fetched ({e}).[/yellow]"
                )
                continue
            except Refused as e:
                if e.status != 409:
                    raise
                self.console.print(f"[yellow]island audit {task.id}: {e.message}[/yellow]")
                continue
            posted += 1
            colour = "red" if info.state == "failed" else "green" if info.state == "passed" else "default"
            self.console.print(
                f"island audit {info.id} of {info.island} (outer step {info.outer_step}): [{colour}]{info.state}[/{colour}]"
            )
        return posted

    def audit(self, task: IslandAuditTask) -> IslandAuditInfo:
        """Replay one audit and post how far the island's pseudo-gradient is from the replay."""
        run = self._run(task.run_id)
        if run.corpus is None:
            raise ValueError(f"{task.run_id} is an RL run: it has no island audits")
        settings = run.pretrain or PretrainSettings()
        data = self.api.island_audit_file(task.id)
        if hashlib.sha256(data).hexdigest() != task.digest or len(data) % 2:
            verdict = Verdict(relative_error=float("inf"), cosine=0.0, passed=False)
        else:
            sent = torch.frombuffer(bytearray(data), dtype=torch.bfloat16)
            fetch = functools.partial(self.api.corpus_shard, task.run_id)
            slots = [(s.epoch, fetch_shard(fetch, s.shard, run.corpus, self.shards)) for s in task.slots]
            start = self._weights(run, task.start_step)
            if task.start_audit is not None:  # an overlapped round: the island's last pseudo-gradient was subtracted
                before = torch.frombuffer(bytearray(self.api.island_audit_file(task.start_audit)), dtype=torch.bfloat16)
                _subtract(start, before)
            verdict = judge(sent, replay(start, slots, run.corpus.pad_id, settings))
        body = IslandAuditVerdict(
            address=self.account.address,
            relative_error=min(verdict.relative_error, MAX_ERROR),
            cosine=max(-1.0, min(1.0, verdict.cosine)),
        )
        return self.api.island_audit_verdict(task.id, body)

    def _run(self, run_id: str) -> RunInfo:
        if run_id not in self.runs:
            self.runs[run_id] = self.api.run_info(run_id)
        return self.runs[run_id]

    def _weights(self, run: RunInfo, step: int) -> PreTrainedModel:
        """Policy step ``step``'s weights: the run's model at 0, else the published step through shardcast."""
        path = run.model if step == 0 else str(self.weights.ensure(run.id, step))
        model: PreTrainedModel = AutoModelForCausalLM.from_pretrained(path)
        return model


def _subtract(model: PreTrainedModel, sent: torch.Tensor) -> None:
    """``model``'s weights minus ``sent`` (a flat bf16 pseudo-gradient, in the parameters' order), in fp32 as the island
    took them (:meth:`trainer.islands.OuterSync.launch`); a pseudo-gradient of the wrong size changes nothing."""
    params = list(model.parameters())
    if sent.numel() != sum(p.numel() for p in params):
        return  # the replay then differs from what was sent, and the audit fails
    with torch.no_grad():
        for p, part in zip(params, sent.float().split([p.numel() for p in params]), strict=True):
            p.sub_(part.view_as(p))
