"""The validator's loop: claim pending submissions, check each, post the verdict.

Models are loaded once per policy step (step N > 0 through shardcast, like a node) and kept
for the two newest steps. A submission whose check raises is left to its claim's expiry, so
another validator (or this one, later) takes it again; nothing is lost.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import UTC, datetime
from functools import cache, lru_cache
from pathlib import Path

import httpx
import torch
from eth_account.signers.local import LocalAccount
from rich.console import Console

from shared.committee import PublicReceipt
from shared.environments.registry import Environment, Problem, get_environment
from shared.http import coordinator_client, get_waiting
from shared.models import load_model
from shared.schemas import CheckOutcome, Claim, ClaimRequest, PublicStatus, VerdictRequest
from shared.shardcast.weights import Weights
from shared.signing import SignedAuth
from shared.verdicts import sign_verdict
from validator.checks import CheckSettings, Context, validate

log = logging.getLogger("intellect.validator")


@lru_cache(maxsize=2)
def _model(path: str):  # type: ignore[no-untyped-def]
    return load_model(path)


@cache
def _environment(name: str) -> tuple[Environment, dict[str, Problem]]:
    environment = get_environment(name)
    return environment, {p.id: p for p in environment.problems()}


CLAIM_WAIT_S = 5.0
"""How long a claim waits at the coordinator for work: short enough that SIGTERM stops us promptly."""


class ClaimLost(Exception):
    """The coordinator no longer holds this validator's claim on the submission."""


class Validator:
    def __init__(
        self, coordinator: str, account: LocalAccount, state_dir: Path, console: Console, *, batch: int = 8,
        settings: CheckSettings | None = None, stop: threading.Event | None = None,
    ) -> None:  # fmt: skip
        """``stop`` also ends any wait for an unreachable coordinator (else up to 240 s)."""
        self.coordinator = coordinator.rstrip("/")
        self.account = account
        self.console = console
        self.batch = batch
        self.settings = settings or CheckSettings()
        self.audience = PublicStatus.model_validate(httpx.get(f"{self.coordinator}/v1/public/status", timeout=30).raise_for_status().json()).audience
        self.stop = stop or threading.Event()
        self.http = coordinator_client(self.coordinator, 60.0, SignedAuth(account, self.audience), self.stop)
        self.weights = Weights(self.coordinator, account, state_dir / "weights", console)
        self.checked = 0
        self._prefetch = ThreadPoolExecutor(max_workers=1, thread_name_prefix="claim")
        self._upcoming: Future[list[Claim]] | None = None

    def close(self) -> None:
        self._prefetch.shutdown(wait=False, cancel_futures=True)  # a claim drawn ahead just lapses
        self.http.close()

    def _post(self, path: str, body: str) -> httpx.Response:
        reply = self.http.post(path, content=body, headers={"content-type": "application/json"})
        if reply.status_code == 409:
            raise ClaimLost(reply.text)
        if reply.status_code >= 400:
            raise RuntimeError(f"{path}: {reply.status_code} {reply.text}")
        return reply

    def run(self, stop: threading.Event, idle_wait: float = 2.0, max_submissions: int | None = None) -> int:
        """Check submissions until ``stop`` is set (or ``max_submissions`` are done); returns how many."""
        torch.set_num_threads(1)
        while not stop.is_set() and (max_submissions is None or self.checked < max_submissions):
            try:
                self._check_batch(None if max_submissions is None else max_submissions - self.checked)
            except httpx.TransportError as e:
                # The coordinator went away mid-request; our claims expire and return to the queue.
                self.console.print(f"[yellow]Lost the coordinator ({type(e).__name__}: {e}); retrying.[/yellow]")
                stop.wait(idle_wait)
            except httpx.HTTPStatusError as e:
                if e.response.status_code < 500:
                    raise
                self.console.print(f"[yellow]The coordinator is unavailable ({e.response.status_code}); retrying.[/yellow]")
                stop.wait(idle_wait)
        return self.checked

    def _claim(self) -> list[Claim]:
        """The reviews drawn for us; the request waits at the coordinator for some to arrive."""
        request = ClaimRequest(address=self.account.address, limit=self.batch, wait_s=CLAIM_WAIT_S)
        return [Claim.model_validate(c) for c in self._post("/v1/validation/claim", request.model_dump_json()).json()]

    def _check_batch(self, left: int | None) -> None:
        """Check one batch (``left``: at most this many more, None: no limit)."""
        upcoming, self._upcoming = self._upcoming, None
        claims = upcoming.result() if upcoming is not None else self._claim()
        for i, claim in enumerate(claims):
            if i == len(claims) - 1 and (left is None or len(claims) < left):
                # The next batch is drawn while this one's last file is checked: no round trip between batches.
                self._upcoming = self._prefetch.submit(self._claim)
            if claim.claim_expires_at <= datetime.now(UTC):
                # Checking it now would be wasted work: it is back in the queue for whoever claims next.
                self.console.print(f"[yellow]{claim.submission_id[:16]}…: claim expired before its turn; skipped.[/yellow]")
                continue
            try:
                receipt = self.check(claim)
            except ClaimLost:
                self.console.print(f"[yellow]{claim.submission_id[:16]}…: claim expired while checking; its verdict was dropped.[/yellow]")
                continue
            self.checked += 1
            verdict = "accepted" if receipt.status == "accepted" else f"[red]{receipt.status}[/red] ({receipt.reason})"
            self.console.print(f"{claim.submission_id[:16]}… from {receipt.address[:10]}…: {verdict}")

    def check(self, claim: Claim) -> PublicReceipt:
        """Check one claimed submission and post the verdict; raises :class:`ClaimLost` if the claim
        expired meanwhile (the coordinator refuses the verdict and the submission is checked again)."""
        try:
            reply = get_waiting(self.http, f"/v1/validation/submissions/{claim.submission_id}/file", tries=6, stop=self.stop)
        except httpx.HTTPStatusError as e:
            if e.response.status_code == 409:  # the claim ran out while the file store was unavailable
                raise ClaimLost(e.response.text) from None
            raise
        task = claim.task.model_copy(update={"model": self.weights.model_for(claim.task)})
        model, tokenizer = _model(task.model)
        environment, problems = _environment(task.environment)
        ctx = Context(task, claim.sha256, claim.oldest_step, claim.newest_step, model, tokenizer, environment, problems)
        verdict = validate(reply.content, ctx, self.settings)
        checks = [CheckOutcome(name=c.name, passed=c.passed, reason=c.reason[:2000], explained=c.explained) for c in verdict.checks]  # type: ignore[arg-type]
        signature = sign_verdict(self.account, self.audience, claim.submission_id, claim.sha256, checks, verdict.untrained_rows)
        body = VerdictRequest(
            address=self.account.address, submission_id=claim.submission_id, checks=checks,
            untrained_rows=verdict.untrained_rows, signature=signature,
        )  # fmt: skip
        return PublicReceipt.model_validate(self._post("/v1/validation/verdicts", body.model_dump_json()).json())
