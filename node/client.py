"""The node's calls to the coordinator, with refusals turned into sentences an operator can act on."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from eth_account.signers.local import LocalAccount

from intellect_protocol.node.settings import NodeSettings
from intellect_protocol.shared.coordinator_client import CoordinatorClient, Refused
from intellect_protocol.shared.environments.bounded import PluginFailure
from intellect_protocol.shared.plugin_schemas import PluginFailureReport
from intellect_protocol.shared.schemas import (
    ErrorCode,
    HeartbeatRequest,
    HeartbeatResponse,
    LeaseRequest,
    NodeSpecs,
    PublicStatus,
    RegisterRequest,
    RegisterResponse,
    SubmissionReceipt,
    TaskSpec,
    WorkWait,
)
from intellect_protocol.shared.version import __version__

EXIT_CLOCK, EXIT_BANNED, EXIT_VERSION, EXIT_REJECTED = 2, 3, 4, 5
EXIT_ENVIRONMENT = 7


OperatorLink = tuple[str, str]
"""(operator address, the operator's signature of the link: :func:`shared.links.sign_link`)."""


class NodeError(Exception):
    """A problem the node cannot retry its way out of; the message says what to do."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class NotRegistered(Exception):
    """The coordinator does not know this address (its ledger was reset, for instance)."""


class TaskLost(Exception):
    """The task can no longer be submitted (lease expired, taken over, already done); lease another."""


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


class NodeClient:
    """The node's calls to the coordinator (through :class:`shared.coordinator_client.CoordinatorClient`,
    retried under its policy until ``stop``), with refusals turned into what the node does next."""

    def __init__(
        self,
        base_url: str,
        account: LocalAccount,
        settings: NodeSettings,
        *,
        on_retry: Callable[[str], None] = lambda _: None,
        stop: threading.Event | None = None,
    ) -> None:
        self.account = account
        self.api = CoordinatorClient(
            base_url,
            account,
            timeout=settings.request_timeout_s,
            stop=stop,
            on_retry=on_retry,
            first_wait_s=settings.backoff_initial_s,
            max_wait_s=settings.backoff_max_s,
        )
        self.base_url = self.api.base_url

    def close(self) -> None:
        self.api.close()

    def public_status(self) -> PublicStatus:
        """The coordinator's public status; also fixes the audience this client signs for."""
        return self.api.public_status()

    def register(self, specs: NodeSpecs, operator: OperatorLink | None) -> RegisterResponse:
        address, signature = operator or (None, None)
        body = RegisterRequest(
            address=self.account.address,
            operator_address=address,
            operator_signature=signature,
            specs=specs,
            client_version=__version__,
        )
        with _translated():
            return self.api.register(body)

    def heartbeat(self, activity: str, metrics: dict[str, float], weights: dict[str, int] | None = None) -> HeartbeatResponse:
        body = HeartbeatRequest(
            address=self.account.address, client_version=__version__, activity=activity, metrics=metrics, weights=weights or {}
        )
        with _translated():
            return self.api.heartbeat(body)

    def lease(self, working_on: list[str] | None = None) -> TaskSpec | WorkWait:
        """A task to work on besides ``working_on``, or why the coordinator has none now."""
        with _translated():
            return self.api.lease(LeaseRequest(address=self.account.address, working_on=working_on or []))

    def submit(self, task_id: str, data: bytes) -> SubmissionReceipt:
        with _translated():
            return self.api.submit(task_id, data)

    def give_back(self, task_id: str, failure: PluginFailure) -> str:
        """Give back a task the run's reward failed on; returns what the coordinator made of it, in one sentence."""
        body = PluginFailureReport(
            address=self.account.address, task_id=task_id, problem_id=failure.problem_id, completion=failure.completion
        )
        try:
            answer = self.api.plugin_failure(body)
        except Refused as e:
            if e.code == ErrorCode.plugin_works_here:
                return e.message
            raise _node_error(e) from None
        paused = " The coordinator paused the run for it." if answer.paused else ""
        return f"The coordinator's run of the reward failed too ({answer.failures} such failures on the run); the task is back in the pool.{paused}"


@contextmanager
def _translated() -> Iterator[None]:
    try:
        yield
    except Refused as e:
        raise _node_error(e) from None


def _node_error(refused: Refused) -> Exception:
    code, message, details = refused.code, refused.message, refused.details
    if code == ErrorCode.node_not_registered:
        return NotRegistered()
    if code in (ErrorCode.lease_expired, ErrorCode.task_not_leased, ErrorCode.conflict):
        return TaskLost(message)
    if code == ErrorCode.timestamp_out_of_window:
        return clock_skew_error(float(details.get("skew_s", 0)), float(details.get("window_s", 0)))
    if code == ErrorCode.node_banned:
        return NodeError(f"This node is {details['notice']}." if details.get("notice") else message, EXIT_BANNED)
    if code == ErrorCode.version_unsupported:
        if "coordinator_protocol" in details:
            return NodeError(message, EXIT_VERSION)
        return version_error(details.get("min_node_version"))
    if code == ErrorCode.signature_invalid:
        return NodeError(
            "The coordinator refused this node's signature. It may have been reset as a new deployment; "
            "start the node again to pick up its new identity.",
            EXIT_REJECTED,
        )
    return NodeError(f"The coordinator refused the request (HTTP {refused.status}, {code}): {message}", EXIT_REJECTED)
