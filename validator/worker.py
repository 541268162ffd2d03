"""The validator's loop: claim pending submissions, check each, post the verdict; between batches, replay the
pretraining islands' steps drawn for audit (:mod:`validator.island_audits`).

Models are loaded once per policy step (step N > 0 through shardcast, like a node) and kept
for the two newest steps. A submission whose check raises is left to its claim's expiry, so
another validator (or this one, later) takes it again; nothing is lost. Once stopped, no claim
is checked (its verdict could no longer be posted): those left lapse the same way.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from datetime import UTC, datetime
from functools import cache, lru_cache
from pathlib import Path

import torch
from eth_account.signers.local import LocalAccount
from rich.console import Console
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from intellect_protocol.shared.committee import PublicReceipt
from intellect_protocol.shared.coordinator_client import CoordinatorClient, Refused, Stopped
from intellect_protocol.shared.environments.bounded import BoundedRewards, PluginFailure
from intellect_protocol.shared.environments.registry import Problem, get_environment
from intellect_protocol.shared.environments.tool_calls import episode_replies, episode_rules
from intellect_protocol.shared.models import load_model
from intellect_protocol.shared.schemas import Claim, ClaimRequest, VerdictRequest
from intellect_protocol.shared.shardcast.client import DownloadError
from intellect_protocol.shared.shardcast.weights import Weights
from intellect_protocol.shared.states import SubmissionStatus
from intellect_protocol.shared.verdicts import sign_verdict
from intellect_protocol.validator.checks import CheckSettings, Context, validate
from intellect_protocol.validator.island_audits import IslandAuditor

log = logging.getLogger("intellect.validator")


@lru_cache(maxsize=2)
def _model(path: str) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    return load_model(path)


@cache
def _environment(name: str, version: str) -> tuple[BoundedRewards, dict[str, Problem]]:
    """The run's problems, and its rewards computed in a bounded process of their own."""
    return BoundedRewards(name, version), {p.id: p for p in get_environment(name, version).problems()}


CLAIM_WAIT_S = 5.0
"""How long a claim waits at the coordinator for work: short enough that SIGTERM stops us promptly."""
AUDIT_LOOK_S = 5.0
"""How often, at most, we ask for islands' steps drawn for us to replay: they wait minutes for a replay, and a look
after every one-file batch (a flood of newcomers' files comes one at a time) doubles our requests to the coordinator."""


class ClaimLost(Exception):
    """The coordinator no longer holds this validator's claim on the submission."""


class Validator:
    def __init__(
        self,
        coordinator: str,
        account: LocalAccount,
        state_dir: Path,
        console: Console,
        *,
        batch: int = 8,
        settings: CheckSettings | None = None,
        stop: threading.Event | None = None,
    ) -> None:
        """Requests to an unreachable or overloaded coordinator are retried until ``stop``."""
        self.account = account
        self.console = console
        self.batch = batch
        self.settings = settings or CheckSettings()
        self.stop = stop or threading.Event()
        self.api = CoordinatorClient(
            coordinator, account, stop=self.stop, on_retry=lambda m: console.print(f"[yellow]{m}[/yellow]")
        )
        self.audience = self.api.audience
        self.weights = Weights(self.api, state_dir / "weights", console)
        self.auditor = IslandAuditor(self.api, account, self.weights, state_dir, console)
        self.checked = 0
        self._audits_looked_at = -math.inf
        self._prefetch = ThreadPoolExecutor(max_workers=1, thread_name_prefix="claim")
        self._upcoming: Future[list[Claim]] | None = None

    def close(self) -> None:
        self._prefetch.shutdown(wait=False, cancel_futures=True)  # a claim drawn ahead just lapses
        self.api.close()

    def run(self, max_submissions: int | None = None) -> int:
        """Check submissions until ``stop`` is set (or ``max_submissions`` are done); returns how many."""
        torch.set_num_threads(1)
        try:
            while not self.stop.is_set() and (max_submissions is None or self.checked < max_submissions):
                self._check_batch(None if max_submissions is None else max_submissions - self.checked)
                if time.monotonic() - self._audits_looked_at >= AUDIT_LOOK_S:
                    self._audits_looked_at = time.monotonic()
                    self.auditor.audit_open()
        except Stopped:
            pass
        return self.checked

    def _claim(self, most: int | None = None) -> list[Claim]:
        """The reviews drawn for us (a batch, or ``most`` if fewer); the request waits at the coordinator for some to arrive."""
        limit = self.batch if most is None else min(self.batch, most)
        return self.api.claim(ClaimRequest(address=self.account.address, limit=limit, wait_s=CLAIM_WAIT_S))

    def _check_batch(self, left: int | None) -> None:
        """Check one batch (``left``: at most this many more, None: no limit)."""
        upcoming, self._upcoming = self._upcoming, None
        claims = upcoming.result() if upcoming is not None else self._claim(left)
        for i, claim in enumerate(claims):
            if self.stop.is_set():
                # The client posts nothing once stopped, so checking the rest would be work thrown away: it lapses
                # back to the queue, as a claim drawn ahead does.
                self.console.print(
                    f"[yellow]Stopping: {len(claims) - i} claimed file(s) left unchecked go back to the queue when "
                    "their claims expire.[/yellow]"
                )
                return
            if i == len(claims) - 1 and len(claims) == self.batch and (left is None or len(claims) < left):
                # A full batch says more work waits: the next is drawn while this one's last file is checked, no round
                # trip between batches. Not after a short one (little waits, or a newcomer's file or an appeal, which
                # come alone): a file drawn ahead then would hold up a proven node's file that arrives meanwhile.
                # With a number of submissions to stop at, never more than it leaves: nothing claimed is left unchecked.
                self._upcoming = self._prefetch.submit(self._claim, None if left is None else left - len(claims))
            if claim.claim_expires_at <= datetime.now(UTC):
                # Checking it now would be wasted work: it is back in the queue for whoever claims next.
                self.console.print(f"[yellow]{claim.submission_id[:16]}…: claim expired before its turn; skipped.[/yellow]")
                continue
            try:
                receipt = self.check(claim)
            except ClaimLost:
                self.console.print(
                    f"[yellow]{claim.submission_id[:16]}…: claim expired while checking; its verdict was dropped.[/yellow]"
                )
                continue
            except PluginFailure as e:
                # The reward code's failure, not the node's: no verdict (no strike); the claim lapses.
                self.console.print(f"[yellow]{claim.submission_id[:16]}…: {e}; skipped, no verdict.[/yellow]")
                continue
            except DownloadError as e:
                # No relay serves the step now (they stopped, or the run moved on): the claim lapses and the
                # submission goes back to the queue, for this validator or another once a relay answers.
                self.console.print(
                    f"[yellow]{claim.submission_id[:16]}…: policy step {claim.task.policy_step} could not be fetched "
                    f"({e}); skipped.[/yellow]"
                )
                continue
            self.checked += 1
            verdict = (
                "accepted" if receipt.status == SubmissionStatus.accepted else f"[red]{receipt.status}[/red] ({receipt.reason})"
            )
            self.console.print(f"{claim.submission_id[:16]}… from {receipt.address[:10]}…: {verdict}")

    def check(self, claim: Claim) -> PublicReceipt:
        """Check one claimed submission and post the verdict; raises :class:`ClaimLost` if the claim
        expired meanwhile (the coordinator refuses the verdict and the submission is checked again)."""
        with _claim_held():
            data = self.api.claimed_file(claim.submission_id)
        task = claim.task.model_copy(update={"model": self.weights.model_for(claim.task)})
        model, tokenizer = _model(task.model)
        answers, problems = _environment(task.environment, task.environment_version)
        declared = get_environment(task.environment, task.environment_version)
        rules = episode_rules(declared, tokenizer, task.sampling.max_tokens)
        environment = episode_replies(answers, declared, tokenizer)
        ctx = Context(task, claim.sha256, claim.oldest_step, claim.newest_step, model, tokenizer, environment, problems, rules)
        verdict = validate(data, ctx, self.settings)
        checks = verdict.checks
        signature = sign_verdict(self.account, self.audience, claim.submission_id, claim.sha256, checks, verdict.untrained_rows)
        body = VerdictRequest(
            address=self.account.address,
            submission_id=claim.submission_id,
            checks=checks,
            untrained_rows=verdict.untrained_rows,
            signature=signature,
        )
        return self.post_verdict(body)

    def post_verdict(self, body: VerdictRequest) -> PublicReceipt:
        """Post a signed verdict; :class:`ClaimLost` if the claim lapsed or was drawn again meanwhile
        (as when this validator loses its role mid-batch)."""
        with _claim_held():
            return self.api.verdict(body)


@contextmanager
def _claim_held() -> Iterator[None]:
    """A 409 means our claim ran out (a slow check, the file store away): the work went back to the queue."""
    try:
        yield
    except Refused as e:
        if e.status == 409:
            raise ClaimLost(e.message) from None
        raise
