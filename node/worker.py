"""``intellect-node join``: register (or resume), then heartbeat and work until told to stop.

Heartbeats run on their own thread so a long generation never makes the node look dead;
the main thread runs the work loop (:mod:`node.work_loop`).
A lost task (lease expired, already submitted) is dropped and the next one leased; an
unreachable coordinator is retried with backoff, so the node rides out restarts.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from datetime import UTC
from pathlib import Path
from typing import TYPE_CHECKING

from eth_account.signers.local import LocalAccount
from packaging.version import Version
from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn

from intellect_protocol.node.client import (
    EXIT_BANNED,
    EXIT_ENVIRONMENT,
    EXIT_VERSION,
    NodeClient,
    NodeError,
    NotRegistered,
    OperatorLink,
    clock_skew_error,
    version_error,
)
from intellect_protocol.node.hardware import probe
from intellect_protocol.node.settings import NodeSettings
from intellect_protocol.node.state import NodeSession, load_session, save_session
from intellect_protocol.node.work_loop import WorkLoop
from intellect_protocol.shared.cli import EXIT_TLS
from intellect_protocol.shared.coordinator_client import Stopped
from intellect_protocol.shared.environments.registry import EnvironmentUnavailable
from intellect_protocol.shared.shardcast.weights import Weights
from intellect_protocol.shared.tls import Untrusted
from intellect_protocol.shared.version import PROTOCOL_VERSION, __version__, protocol_mismatch

if TYPE_CHECKING:
    from intellect_protocol.node.work import TaskResult


class Heartbeats(threading.Thread):
    """Sends heartbeats every interval; records a fatal error and sets ``stop`` when one occurs."""

    def __init__(
        self,
        client: NodeClient,
        session: NodeSession,
        state_dir: Path,
        console: Console,
        stop: threading.Event,
        interval: float,
        reregister: Callable[[], NodeSession],
    ) -> None:
        super().__init__(name="heartbeats", daemon=True)
        self.client, self.session, self.state_dir, self.console, self.stop = client, session, state_dir, console, stop
        self.interval = interval
        self.reregister = reregister
        self.activity = "starting"  # until the work loop has its model code and finisher loaded
        self.runs = threading.Event()
        """Set once the coordinator names an active run: only then does the node load its model code."""
        self.metrics: dict[str, float] = {}
        self.weights: Weights | None = None
        self.error: NodeError | None = None

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                try:
                    held = dict(self.weights.held) if self.weights is not None else None
                    beat = self.client.heartbeat(self.activity, dict(self.metrics), held)
                except NotRegistered:
                    self.console.print("[yellow]The coordinator no longer knows this node; registering again.[/yellow]")
                    self.session = self.reregister()
                    continue
                if beat.action == "stop":
                    raise NodeError(f"This node is {beat.reason}.", EXIT_BANNED)
                if beat.policy_steps:
                    self.runs.set()
                if self.weights is not None:
                    for run_id, step in beat.policy_steps.items():
                        self.weights.prefetch(run_id, step)
                if beat.status != self.session.last_status:
                    self.console.print(f"Status: [bold]{beat.status}[/bold]")
                self.session.last_status = beat.status
                self.session.last_heartbeat_at = time.time()
                save_session(self.state_dir, self.session)
                self.interval = beat.heartbeat_interval_s
                self.stop.wait(self.interval)
        except Stopped:
            pass
        except NodeError as e:
            self.error = e
            self.stop.set()
        except Untrusted as e:  # e.g. the coordinator's certificate expired while this node ran
            self.error = NodeError(str(e), EXIT_TLS)
            self.stop.set()


def join(
    account: LocalAccount,
    coordinator: str,
    settings: NodeSettings,
    console: Console,
    *,
    operator: OperatorLink | None = None,
    stop: threading.Event,
    finishers: ProcessPoolExecutor,
) -> None:
    """Run until ``stop`` is set, finishing tasks in ``finishers`` (:func:`node.finishers.finisher_pool`, the
    caller's to stop); raises :class:`NodeError` for what retrying cannot fix."""
    client = NodeClient(coordinator, account, settings, on_retry=lambda m: console.print(f"[yellow]{m}[/yellow]"), stop=stop)
    state_dir = settings.state_dir / account.address.lower()
    beats: Heartbeats | None = None
    try:
        status = client.public_status()
        if Version(__version__) < Version(status.min_node_version):
            raise version_error(status.min_node_version)
        if mismatch := protocol_mismatch(PROTOCOL_VERSION, status.protocol_version):
            raise NodeError(mismatch, EXIT_VERSION)
        skew = time.time() - status.server_time
        if abs(skew) > status.signature_window_s:
            raise clock_skew_error(skew, status.signature_window_s)

        session = load_session(state_dir)
        if session and (session.coordinator, session.audience, session.address) == (
            client.base_url,
            status.audience,
            account.address,
        ):
            console.print(f"Resuming as {account.address} on {client.base_url} (registered {session.registered_at}).")
        else:
            session = _register(client, status.audience, state_dir, console, operator)

        beats = Heartbeats(
            client,
            session,
            state_dir,
            console,
            stop,
            status.heartbeat_interval_s,
            lambda: _register(client, status.audience, state_dir, console, operator),
        )
        weights = Weights(client.api, state_dir / "weights", console)
        beats.weights = weights
        beats.start()
        if _wait_for_a_run(beats, stop, console):
            _work(client, console, stop, settings, beats, weights, status.heartbeat_interval_s, finishers)
    except Stopped:
        pass
    except Untrusted as e:
        raise NodeError(str(e), EXIT_TLS) from None
    except EnvironmentUnavailable as e:
        raise NodeError(f"This node cannot work on the run it was given: {e}.", EXIT_ENVIRONMENT) from None
    finally:
        stop.set()
        if beats is not None:
            beats.join(timeout=15)
        client.close()
    if beats is not None and beats.error is not None:
        raise beats.error


def _work(
    client: NodeClient,
    console: Console,
    stop: threading.Event,
    settings: NodeSettings,
    beats: Heartbeats,
    weights: Weights,
    idle_wait: float,
    finishers: ProcessPoolExecutor,
) -> None:
    """Work until ``stop``: a work loop again after each re-registration, all with the node's one finisher."""
    with _live_progress(console) as on_done:
        while not stop.is_set():  # again after the coordinator forgot this node and it registered anew
            WorkLoop(
                client,
                console,
                stop,
                idle_wait=idle_wait,
                activity=beats,
                on_done=on_done,
                backend=settings.backend,
                dtype=settings.dtype,
                finishers=finishers,
                weights=weights,
            ).run()


def _wait_for_a_run(beats: Heartbeats, stop: threading.Event, console: Console) -> bool:
    """Wait until the coordinator names an active run (True) or the node is stopped (False). A node with
    nothing to do loads no model code (its finisher loads none either): torch is seconds of CPU and hundreds of MiB."""
    if beats.runs.wait(1.0):
        return True
    if not stop.is_set():  # a ban in that second is said by its own sentence
        beats.activity = "waiting: no_run"
        console.print("No active run on this coordinator yet; the model code loads when one starts.")
    while not stop.is_set():
        if beats.runs.wait(0.2):
            beats.activity = "starting"
            return True
    return False


@contextmanager
def _live_progress(console: Console) -> Iterator[Callable[[TaskResult], None]]:
    """A live status line under the log on a terminal: tasks done, generation speed, last reward."""
    columns = (
        SpinnerColumn(),
        TextColumn("working: {task.completed} tasks, {task.fields[rate]} tok/s, last reward {task.fields[reward]}"),
    )
    with Progress(*columns, console=console, transient=True, disable=not console.is_terminal) as progress:
        row = progress.add_task("work", total=None, rate="-", reward="-")

        def on_done(result: TaskResult) -> None:
            rate = result.tokens / result.generate_s if result.generate_s else 0.0
            progress.update(row, advance=1, rate=f"{rate:.0f}", reward=f"{result.mean_reward:.2f}")

        yield on_done


def _register(client: NodeClient, audience: str, state_dir: Path, console: Console, operator: OperatorLink | None) -> NodeSession:
    specs = probe(state_dir)
    reply = client.register(specs, operator)
    session = NodeSession(
        coordinator=client.base_url,
        audience=audience,
        address=reply.address,
        registered_at=reply.first_seen.astimezone(UTC).isoformat(),
        last_status=reply.status,
    )
    save_session(state_dir, session)
    gpus = ", ".join(g.name for g in specs.gpus) or "no GPU"
    console.print(
        f"Registered {reply.address} with {client.base_url}: {specs.cpu_cores} cores, "
        f"{specs.ram_bytes / 2**30:.1f} GiB RAM, {gpus}. Heartbeating every {reply.heartbeat_interval_s:g} s; Ctrl-C to stop."
    )
    return session
