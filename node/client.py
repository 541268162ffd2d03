"""The node's HTTP client for the coordinator: signed requests, retries with backoff, and
errors turned into sentences an operator can act on."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
from eth_account.signers.local import LocalAccount
from pydantic import BaseModel

from node.settings import NodeSettings
from shared.schemas import (
    ErrorCode,
    HeartbeatResponse,
    NodeSpecs,
    PublicStatus,
    RegisterResponse,
    SubmissionReceipt,
    TaskSpec,
    WorkWait,
)
from shared.signing import SignedAuth
from shared.version import __version__

EXIT_CLOCK, EXIT_BANNED, EXIT_VERSION, EXIT_REJECTED, EXIT_STOPPED = 2, 3, 4, 5, 6


class NodeError(Exception):
    """A problem the node cannot retry its way out of; the message says what to do."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class NotRegistered(Exception):
    """The coordinator does not know this address (its ledger was reset, for instance)."""


class TaskLost(Exception):
    """The task can no longer be submitted (lease expired, taken over, already done); lease another."""


class Stopped(Exception):
    """The caller asked the client to stop while it was waiting to retry."""


def clock_skew_error(skew_s: float, window_s: float) -> NodeError:
    return NodeError(
        f"This machine's clock is {skew_s:+.0f} s off the coordinator's (at most ±{window_s:.0f} s is accepted), "
        "so every signed request would be refused. Sync the clock (enable NTP, e.g. `timedatectl set-ntp true`) and start again.",
        EXIT_CLOCK,
    )


def version_error(min_node_version: object) -> NodeError:
    return NodeError(
        f"This node client ({__version__}) is older than the coordinator accepts ({min_node_version}). "
        "Upgrade with: pip install -U intellect-protocol",
        EXIT_VERSION,
    )


class CoordinatorClient:
    def __init__(
        self,
        base_url: str,
        account: LocalAccount,
        settings: NodeSettings,
        *,
        on_retry: Callable[[str], None] = lambda _: None,
        stop: threading.Event | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.account = account
        self.settings = settings
        self.on_retry = on_retry
        self.stop = stop or threading.Event()
        self.auth: SignedAuth | None = None
        self.unreachable_since: float | None = None
        """Since when requests fail to connect (None: the last one connected), to say when it is back."""
        self.http = httpx.Client(
            base_url=self.base_url,
            timeout=settings.request_timeout_s,
            headers={"user-agent": f"intellect-node/{__version__}"},
        )

    def close(self) -> None:
        self.http.close()

    def public_status(self) -> PublicStatus:
        """The coordinator's public status; also fixes the audience this client signs for."""
        status = PublicStatus.model_validate(self._request("GET", "/v1/public/status", signed=False))
        self.auth = SignedAuth(self.account, status.audience)
        return status

    def register(self, specs: NodeSpecs, operator_address: str | None) -> RegisterResponse:
        body = {
            "address": self.account.address,
            "operator_address": operator_address,
            "specs": specs.model_dump(),
            "client_version": __version__,
        }
        return RegisterResponse.model_validate(self._request("POST", "/v1/nodes/register", body))

    def heartbeat(self, activity: str, metrics: dict[str, float], weights: dict[str, int] | None = None) -> HeartbeatResponse:
        body = {
            "address": self.account.address,
            "client_version": __version__,
            "activity": activity,
            "metrics": metrics,
            "weights": weights or {},
        }
        return HeartbeatResponse.model_validate(self._request("POST", "/v1/nodes/heartbeat", body))

    def lease(self, working_on: list[str] | None = None) -> TaskSpec | WorkWait:
        """A task to work on besides ``working_on``, or why the coordinator has none now."""
        reply = self._request("POST", "/v1/tasks/lease", {"address": self.account.address, "working_on": working_on or []})
        if isinstance(reply, httpx.Response):  # 204: no work, and why
            headers = reply.headers
            return WorkWait(
                reason=headers.get("x-intellect-wait", "no_run"),  # type: ignore[arg-type]
                message=headers.get("x-intellect-wait-message", "the coordinator has no work now"),
                retry_after_s=float(headers.get("retry-after", "5")),
            )
        return TaskSpec.model_validate(reply)

    def submit(self, task_id: str, data: bytes) -> SubmissionReceipt:
        reply = self._request("POST", "/v1/submissions", content=data, params={"task": task_id})
        return SubmissionReceipt.model_validate(reply)

    def _request(
        self,
        method: str,
        path: str,
        body: BaseModel | dict[str, Any] | None = None,
        *,
        signed: bool = True,
        content: bytes | None = None,
        params: dict[str, str] | None = None,
    ) -> Any:
        delay = self.settings.backoff_initial_s
        while True:
            if self.stop.is_set():
                raise Stopped
            try:
                if content is not None:
                    response = self.http.request(
                        method, path, content=content, params=params, auth=self.auth if signed else None,
                        headers={"content-type": "application/octet-stream"},
                    )  # fmt: skip
                else:
                    response = self.http.request(method, path, json=body, params=params, auth=self.auth if signed else None)
            except httpx.TransportError as e:
                problem = f"Cannot reach the coordinator at {self.base_url} ({type(e).__name__}: {e or 'no detail'})"
                self.unreachable_since = self.unreachable_since or time.monotonic()
            else:
                if self.unreachable_since is not None:
                    self.on_retry(f"The coordinator at {self.base_url} answers again (after {time.monotonic() - self.unreachable_since:.0f} s).")
                    self.unreachable_since = None
                if response.status_code == 204:
                    return response
                if response.status_code < 400:
                    return response.json()
                if response.status_code != 429 and response.status_code < 500:
                    raise self._error(response)
                problem = (
                    "The coordinator asks this node to slow down (429)"
                    if response.status_code == 429
                    else f"The coordinator failed with HTTP {response.status_code}"
                )
            self.on_retry(f"{problem}; retrying in {delay:.0f} s.")
            if self.stop.wait(delay * random.uniform(0.8, 1.2)):
                raise Stopped
            delay = min(delay * 2, self.settings.backoff_max_s)

    def _error(self, response: httpx.Response) -> Exception:
        try:
            payload = response.json()
            code, message, details = payload.get("code"), payload.get("message", ""), payload.get("details") or {}
        except (ValueError, AttributeError):
            code, message, details = None, response.text[:200], {}
        if code == ErrorCode.node_not_registered:
            return NotRegistered()
        if code in (ErrorCode.lease_expired, ErrorCode.task_not_leased, ErrorCode.conflict):
            return TaskLost(message)
        if code == ErrorCode.timestamp_out_of_window:
            return clock_skew_error(float(details.get("skew_s", 0)), float(details.get("window_s", 0)))
        if code == ErrorCode.node_banned:
            return NodeError(
                f"The coordinator's operator banned this node ({details.get('reason') or message}). Contact them to appeal.",
                EXIT_BANNED,
            )
        if code == ErrorCode.version_unsupported:
            return version_error(details.get("min_node_version"))
        if code == ErrorCode.signature_invalid:
            return NodeError(
                "The coordinator refused this node's signature. It may have been reset as a new deployment; "
                "start the node again to pick up its new identity.",
                EXIT_REJECTED,
            )
        return NodeError(f"The coordinator refused the request (HTTP {response.status_code}, {code}): {message}", EXIT_REJECTED)
