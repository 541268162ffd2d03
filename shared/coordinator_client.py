"""One client for the coordinator's API, used by every role: node, validator, trainer, relay and shardcast downloads.

The contract:

- a method per route, taking and returning that route's schema;
- requests signed by ``account`` for the deployment's audience, fetched once from
  ``/v1/public/status`` on the first signed request;
- one retry policy: a request that got no answer (refused, reset, timed out) or an answer of 429 or 5xx is sent again,
  freshly signed, after the server's ``Retry-After`` (at most ``max_wait_s``) or else an exponential backoff with
  jitter, until it is answered, ``stop`` is set (:class:`Stopped`) or ``give_up_s`` has passed (:class:`Unavailable`).
  Every route may be sent twice: the ledger answers a repeat as a conflict or with what it already recorded;
- any other 4xx raises :class:`Refused` with the coordinator's error code, message and details;
- a TLS failure (a certificate not trusted, a server without TLS) raises :class:`Untrusted` at once,
  with the sentence :func:`shared.tls.untrusted` writes. Trust comes from :func:`shared.tls.client_context`.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
from eth_account.signers.local import LocalAccount
from pydantic import BaseModel

from intellect_protocol.shared import client_errors, island_schemas

# Re-exported: every role catches them from here.
from intellect_protocol.shared.client_errors import ProtocolError as ProtocolError
from intellect_protocol.shared.client_errors import Refused as Refused
from intellect_protocol.shared.client_errors import Stopped as Stopped
from intellect_protocol.shared.client_errors import Unavailable as Unavailable
from intellect_protocol.shared.committee import AppealInfo, AppealRequest, PublicReceipt
from intellect_protocol.shared.cpu_ledger import spent
from intellect_protocol.shared.environments.bounded import RewardLimits
from intellect_protocol.shared.island_audit_schemas import IslandAuditInfo, IslandAuditTask, IslandAuditVerdict
from intellect_protocol.shared.plugin_schemas import PluginFailureAnswer, PluginFailureReport
from intellect_protocol.shared.public_schemas import Credit, PublicNode
from intellect_protocol.shared.relay_schemas import RelayInfo, RelayRegister, RelayReportRequest
from intellect_protocol.shared.run_schemas import RunInfo
from intellect_protocol.shared.schemas import (
    AcceptedRollouts,
    Claim,
    ClaimRequest,
    HeartbeatRequest,
    HeartbeatResponse,
    LeaseRequest,
    PublicStatus,
    RegisterRequest,
    RegisterResponse,
    SubmissionReceipt,
    TaskSpec,
    TrainerMetricsRequest,
    VerdictRequest,
    WorkWait,
)
from intellect_protocol.shared.settlement import ChainInfo, EpochInfo, EpochProof, LedgerEntry
from intellect_protocol.shared.shardcast.manifest import ManifestEntry, SignedManifest
from intellect_protocol.shared.signing import SignedAuth
from intellect_protocol.shared.tls import Untrusted, client_context, speaks_tls, untrusted
from intellect_protocol.shared.version import __version__

log = logging.getLogger("intellect.client")


class CoordinatorClient:
    def __init__(
        self,
        base_url: str,
        account: LocalAccount | None = None,
        *,
        timeout: float = 60.0,
        stop: threading.Event | None = None,
        give_up_s: float | None = None,
        first_wait_s: float = 0.5,
        max_wait_s: float = 10.0,
        on_retry: Callable[[str], None] = log.warning,
    ) -> None:
        """``give_up_s``: None retries until ``stop``. ``on_retry`` hears each retry, and the first
        answer after the coordinator could not be reached, as a sentence."""
        self.base_url = base_url.rstrip("/")
        self.account = account
        self.stop = stop or threading.Event()
        self.give_up_s, self.first_wait_s, self.max_wait_s = give_up_s, first_wait_s, max_wait_s
        self.on_retry = on_retry
        self.unreachable_since: float | None = None
        """Since when requests fail to connect (None: the last one connected)."""
        self.ever_answered = False
        """Whether the coordinator has answered this client once: if not, the URL itself may be wrong."""
        self._status: PublicStatus | None = None
        self._auth: SignedAuth | None = None
        self.http = httpx.Client(
            base_url=self.base_url,
            timeout=timeout,
            headers={"user-agent": f"intellect/{__version__}"},
            verify=client_context(),
        )

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> CoordinatorClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # Public routes.

    def public_status(self) -> PublicStatus:
        """The coordinator's public status (fetched anew); fixes the audience signed requests name."""
        self._status = PublicStatus.model_validate(self._send("GET", "/v1/public/status").json())
        return self._status

    @property
    def status(self) -> PublicStatus:
        """The public status as last fetched (fetched now if never)."""
        return self._status or self.public_status()

    @property
    def audience(self) -> str:
        return self.status.audience

    def run_info(self, run_id: str) -> RunInfo:
        return RunInfo.model_validate(self._send("GET", f"/v1/public/runs/{run_id}").json())

    def runs(self) -> list[RunInfo]:
        """Every run, newest first."""
        return [RunInfo.model_validate(run) for run in self._send("GET", "/v1/public/runs").json()]

    def node(self, address: str) -> PublicNode:
        return PublicNode.model_validate(self._send("GET", f"/v1/public/nodes/{address}").json())

    def credit(self, address: str) -> Credit:
        """Any address's credit in the ledger, pending and final (zero for one it never heard of)."""
        return Credit.model_validate(self._send("GET", f"/v1/public/nodes/{address}/credit").json())

    def receipt(self, submission_id: str) -> PublicReceipt:
        return PublicReceipt.model_validate(self._send("GET", f"/v1/public/submissions/{submission_id}").json())

    def receipts(self, address: str, limit: int) -> list[PublicReceipt]:
        reply = self._send("GET", "/v1/public/submissions", params={"address": address, "limit": limit})
        return [PublicReceipt.model_validate(r) for r in reply.json()]

    # Settlement (public).

    def chain_info(self) -> ChainInfo:
        return ChainInfo.model_validate(self._send("GET", "/v1/public/chain").json())

    def epochs(self, limit: int = 50) -> list[EpochInfo]:
        return [EpochInfo.model_validate(e) for e in self._send("GET", "/v1/public/epochs", params={"limit": limit}).json()]

    def epoch(self, epoch: int) -> EpochInfo:
        return EpochInfo.model_validate(self._send("GET", f"/v1/public/epochs/{epoch}").json())

    def epoch_proof(self, epoch: int, address: str) -> EpochProof:
        return EpochProof.model_validate(self._send("GET", f"/v1/public/epochs/{epoch}/proofs/{address}").json())

    def ledger_page(self, after: int, limit: int = 1000) -> list[LedgerEntry]:
        reply = self._send("GET", "/v1/public/ledger", params={"after": after, "limit": limit})
        return [LedgerEntry.model_validate(e) for e in reply.json()]

    # Nodes.

    def register(self, body: RegisterRequest) -> RegisterResponse:
        return RegisterResponse.model_validate(self._send("POST", "/v1/nodes/register", body=body).json())

    def heartbeat(self, body: HeartbeatRequest) -> HeartbeatResponse:
        return HeartbeatResponse.model_validate(self._send("POST", "/v1/nodes/heartbeat", body=body).json())

    def lease(self, body: LeaseRequest) -> TaskSpec | WorkWait:
        """A task, or why the coordinator has none now (its 204 answer)."""
        reply = self._send("POST", "/v1/tasks/lease", body=body)
        if reply.status_code == 204:
            return WorkWait(
                reason=reply.headers.get("x-intellect-wait", "no_run"),
                message=reply.headers.get("x-intellect-wait-message", "the coordinator has no work now"),
                retry_after_s=float(reply.headers.get("retry-after", "5")),
            )
        return TaskSpec.model_validate(reply.json())

    def submit(self, task_id: str, data: bytes) -> SubmissionReceipt:
        reply = self._send("POST", "/v1/submissions", content=data, params={"task": task_id})
        return SubmissionReceipt.model_validate(reply.json())

    def plugin_failure(self, body: PluginFailureReport) -> PluginFailureAnswer:
        # The coordinator runs the reward again before it answers, in a process it may have to start first.
        limits = RewardLimits()
        reply = self._send("POST", "/v1/tasks/plugin-failure", body=body, read_s=limits.start_timeout_s + limits.timeout_s + 30)
        return PluginFailureAnswer.model_validate(reply.json())

    def appeal(self, body: AppealRequest) -> AppealInfo:
        return AppealInfo.model_validate(self._send("POST", "/v1/appeals", body=body).json())

    # Validators.

    def claim(self, body: ClaimRequest) -> list[Claim]:
        return [Claim.model_validate(c) for c in self._send("POST", "/v1/validation/claim", body=body).json()]

    def claimed_file(self, submission_id: str) -> bytes:
        return self._send("GET", f"/v1/validation/submissions/{submission_id}/file", signed=True).content

    def verdict(self, body: VerdictRequest) -> PublicReceipt:
        return PublicReceipt.model_validate(self._send("POST", "/v1/validation/verdicts", body=body).json())

    # Trainers.

    def accepted(self, run_id: str, after: int, limit: int, wait_s: float = 0.0) -> list[AcceptedRollouts]:
        """Accepted submissions after cursor ``after``; the coordinator holds the request up to ``wait_s`` for the first."""
        params = {"run": run_id, "after": after, "limit": limit, "wait_s": wait_s}
        reply = self._send("GET", "/v1/trainer/rollouts", params=params, signed=True)
        return [AcceptedRollouts.model_validate(e) for e in reply.json()]

    def accepted_file(self, submission_id: str) -> bytes:
        return self._send("GET", f"/v1/trainer/submissions/{submission_id}/file", signed=True).content

    def island_join(self, body: island_schemas.IslandJoin) -> int:
        """Returns the claims released (those the island held but never reported)."""
        return int(self._send("POST", "/v1/trainer/islands/join", body=body).json()["released"])

    def island_claim(self, body: island_schemas.IslandClaim) -> list[AcceptedRollouts]:
        return [AcceptedRollouts.model_validate(e) for e in self._send("POST", "/v1/trainer/islands/claim", body=body).json()]

    def island_claim_shards(self, body: island_schemas.IslandClaim) -> island_schemas.ShardClaims:
        return island_schemas.ShardClaims.model_validate(self._send("POST", "/v1/trainer/islands/claim-shards", body=body).json())

    def corpus_shard(self, run_id: str, sha256: str) -> bytes:  # unchecked: see shared.pretraining.corpus.read_shard
        return self._send("GET", f"/v1/trainer/runs/{run_id}/shards/{sha256}", signed=True).content

    def island_report(self, body: island_schemas.IslandReport) -> None:
        self._send("POST", "/v1/trainer/islands/report", body=body)

    def island_vouch(self, body: island_schemas.IslandVouch) -> None:
        self._send("POST", "/v1/trainer/islands/vouch", body=body)

    def island_heal_check(self, body: island_schemas.IslandHealCheck) -> None:  # Refused (409): not the run's agreed state
        self._send("POST", "/v1/trainer/islands/heal-check", body=body)

    def island_settle(self, body: island_schemas.IslandSettle) -> island_schemas.SettleReply:
        return island_schemas.SettleReply.model_validate(self._send("POST", "/v1/trainer/islands/settle", body=body).json())

    def upload_pseudo_gradient(self, run_id: str, data: bytes) -> None:
        self._send("POST", "/v1/trainer/pseudo-gradients", content=data, params={"run": run_id})

    def island_audits(self, limit: int = 4) -> list[IslandAuditTask]:
        reply = self._send("GET", "/v1/validation/island-audits", params={"limit": limit}, signed=True)
        return [IslandAuditTask.model_validate(a) for a in reply.json()]

    def island_audit_file(self, audit_id: int) -> bytes:  # unchecked: its sha256 is the audit's digest
        return self._send("GET", f"/v1/validation/island-audits/{audit_id}/pseudo-gradient", signed=True).content

    def island_audit_verdict(self, audit_id: int, body: IslandAuditVerdict) -> IslandAuditInfo:
        reply = self._send("POST", f"/v1/validation/island-audits/{audit_id}/verdict", body=body)
        return IslandAuditInfo.model_validate(reply.json())

    def islands(self, run_id: str) -> list[island_schemas.IslandStatus]:
        return [
            island_schemas.IslandStatus.model_validate(i) for i in self._send("GET", f"/v1/public/runs/{run_id}/islands").json()
        ]

    def trainer_metrics(self, body: TrainerMetricsRequest) -> None:
        self._send("POST", "/v1/trainer/metrics", body=body)

    def publish_manifest(self, signed: SignedManifest) -> ManifestEntry:
        return ManifestEntry.model_validate(self._send("POST", "/v1/manifests", body=signed).json())

    # Shardcast.

    def manifest(self, run_id: str, step: int | str) -> ManifestEntry | None:
        """Step ``step`` of the run (``"latest"``: the newest); None if there is none."""
        try:
            return ManifestEntry.model_validate(self._send("GET", f"/v1/manifests/{run_id}/{step}").json())
        except Refused as e:
            if e.status == 404:
                return None
            raise

    def manifests(self, after: int, wait_s: float = 0.0, limit: int = 100) -> list[ManifestEntry]:
        """Manifests after log position ``after``, waiting up to ``wait_s`` for one (a long poll)."""
        reply = self._send("GET", "/v1/manifests", params={"after": after, "wait_s": wait_s, "limit": limit}, read_s=wait_s + 30)
        return [ManifestEntry.model_validate(e) for e in reply.json()]

    def role_holders(self, role: str) -> set[str]:
        return set(self._send("GET", f"/v1/roles/{role}").json())

    def relays(self) -> list[RelayInfo]:
        return [RelayInfo.model_validate(r) for r in self._send("GET", "/v1/relays").json()]

    def register_relay(self, body: RelayRegister) -> RelayInfo:
        return RelayInfo.model_validate(self._send("POST", "/v1/relays", body=body).json())

    def report_relay(self, body: RelayReportRequest) -> None:
        self._send("POST", "/v1/relays/reports", body=body)

    # The one way a request is sent.

    def _send(
        self,
        method: str,
        path: str,
        *,
        body: BaseModel | None = None,
        content: bytes | None = None,
        params: dict[str, Any] | None = None,
        signed: bool | None = None,
        read_s: float | None = None,
    ) -> httpx.Response:
        """Send until answered under the retry policy; ``signed`` defaults to: every request with a body."""
        if body is not None:
            content, kind = body.model_dump_json().encode(), "application/json"
        else:
            kind = "application/octet-stream"
        auth = self._signer() if (signed if signed is not None else content is not None) else None
        headers = {"content-type": kind} if content is not None else {}
        timeout = httpx.Timeout(self.http.timeout.connect, read=read_s) if read_s is not None else httpx.USE_CLIENT_DEFAULT
        started, wait = time.monotonic(), self.first_wait_s
        while True:
            if self.stop.is_set():
                raise Stopped(f"stopped before {method} {path} was answered")
            try:
                with spent("requests"):
                    reply = self.http.request(
                        method, path, content=content, params=params, headers=headers, auth=auth, timeout=timeout
                    )
            except httpx.TransportError as e:
                if self.stop.is_set() or self.http.is_closed:
                    # Closed under it by a stop (a long poll's socket goes with it: "Bad file descriptor"): no retry, no warning.
                    raise Stopped(f"stopped while {method} {path} was on its way") from e
                if (sentence := untrusted(e, self.base_url)) is not None:
                    raise Untrusted(sentence) from e
                hung_up = isinstance(e, httpx.RemoteProtocolError | httpx.ReadError)  # it took the connection, then closed it
                if hung_up and not self.ever_answered and self.base_url.startswith("http://") and speaks_tls(self.base_url):
                    # A TLS server hangs up on plain HTTP ("Server disconnected"): resending could never help.
                    raise Untrusted(f"{self.base_url} speaks TLS: try https:// instead of http://.") from e
                problem, retry_after = (
                    f"cannot reach the coordinator at {self.base_url} ({type(e).__name__}: {e or 'no detail'})",
                    None,
                )
                if not self.ever_answered:
                    problem += (
                        ", which has not answered once since this started: check the URL and port, "
                        f"and that a coordinator runs there (curl {self.base_url}/healthz)"
                    )
                self.unreachable_since = self.unreachable_since or time.monotonic()
            else:
                if self.unreachable_since is not None:
                    again = " again" if self.ever_answered else ""
                    self.on_retry(
                        f"The coordinator at {self.base_url} answers{again} (after {time.monotonic() - self.unreachable_since:.0f} s)."
                    )
                    self.unreachable_since = None
                self.ever_answered = True
                if reply.status_code < 400:
                    return reply
                if reply.status_code != 429 and reply.status_code < 500:
                    raise client_errors.refused(reply)
                problem, retry_after = client_errors.overloaded(reply), client_errors.retry_after(reply)
            pause = min(retry_after if retry_after is not None else wait * random.uniform(0.8, 1.2), self.max_wait_s)
            if self.give_up_s is not None and time.monotonic() + pause - started > self.give_up_s:
                raise Unavailable(f"{method} {path}: {problem}; gave up after {time.monotonic() - started:.0f} s")
            self.on_retry(f"{problem[0].upper()}{problem[1:]}; retrying {method} {path} in {pause:.1f} s.")
            if self.stop.wait(pause):
                raise Stopped(f"stopped before {method} {path} was answered")
            wait = min(wait * 2, self.max_wait_s)

    def _signer(self) -> SignedAuth:
        if self.account is None:
            raise ValueError("this client has no account to sign with")
        if self._auth is None:
            self._auth = SignedAuth(self.account, self.audience)
        return self._auth
