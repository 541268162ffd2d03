"""``intellect-node join``: register (or resume), then heartbeat and work until told to stop.

Heartbeats run on their own thread so a long generation never makes the node look dead;
the main thread leases tasks, runs them (:mod:`node.work`) and uploads their rollout files.
A lost task (lease expired, already submitted) is dropped and the next one leased; an
unreachable coordinator is retried with backoff, so the node rides out restarts.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, Future, ThreadPoolExecutor
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
    NodeClient,
    NodeError,
    NotRegistered,
    OperatorLink,
    TaskLost,
    clock_skew_error,
    version_error,
)
from intellect_protocol.node.hardware import probe
from intellect_protocol.node.settings import BackendKind, Dtype, NodeSettings
from intellect_protocol.node.state import NodeSession, load_session, save_session
from intellect_protocol.shared.coordinator_client import Stopped
from intellect_protocol.shared.schemas import WorkWait
from intellect_protocol.shared.shardcast.client import DownloadError
from intellect_protocol.shared.shardcast.weights import Weights
from intellect_protocol.shared.version import __version__

if TYPE_CHECKING:
    from intellect_protocol.node.work import TaskResult
    from intellect_protocol.shared.schemas import TaskSpec


STOP_GRACE_S = 5.0
"""How long a node asked to stop keeps uploading work it already finished."""


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
        reregister,
    ) -> None:
        super().__init__(name="heartbeats", daemon=True)
        self.client, self.session, self.state_dir, self.console, self.stop = client, session, state_dir, console, stop
        self.interval = interval
        self.reregister = reregister
        self.activity = "idle"
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
                    raise NodeError(
                        f"The coordinator's operator banned this node ({beat.reason}). Contact them to appeal.", EXIT_BANNED
                    )
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


def join(
    account: LocalAccount,
    coordinator: str,
    settings: NodeSettings,
    console: Console,
    *,
    operator: OperatorLink | None = None,
    stop: threading.Event,
) -> None:
    """Run until ``stop`` is set; raises :class:`NodeError` for what retrying cannot fix."""
    client = NodeClient(coordinator, account, settings, on_retry=lambda m: console.print(f"[yellow]{m}[/yellow]"), stop=stop)
    state_dir = settings.state_dir / account.address.lower()
    beats: Heartbeats | None = None
    try:
        status = client.public_status()
        if Version(__version__) < Version(status.min_node_version):
            raise version_error(status.min_node_version)
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
        from intellect_protocol.node.work import finisher_pool, stop_finishers

        finishers = finisher_pool()
        try:
            with _live_progress(console) as on_done:
                while not stop.is_set():
                    work_loop(
                        client,
                        console,
                        stop,
                        beats,
                        status.heartbeat_interval_s,
                        on_done=on_done,
                        backend=settings.backend,
                        dtype=settings.dtype,
                        finishers=finishers,
                        weights=weights,
                    )
        finally:
            stop_finishers(finishers)
    except Stopped:
        pass
    finally:
        stop.set()
        if beats is not None:
            beats.join(timeout=15)
        client.close()
    if beats is not None and beats.error is not None:
        raise beats.error


def work_loop(
    client: NodeClient,
    console: Console,
    stop: threading.Event,
    beats: Heartbeats | None,
    idle_wait: float,
    max_tasks: int | None = None,
    on_done: Callable[[TaskResult], None] | None = None,
    backend: BackendKind = "torch",
    dtype: Dtype = "float32",
    finishers: Executor | None = None,
    weights: Weights | None = None,
) -> int:
    """Lease, generate, score and prove each task here. This thread only generates: the next task
    is leased on a helper thread meanwhile, the previous one is scored, proven and written in
    ``finishers`` (:func:`node.work.finisher_pool`, a process so it never waits for this one's
    GIL; one is started per call when not given) and uploaded from another thread, so the
    protocol's work hides behind the model's. As many tasks are in flight as the coordinator lets
    one node hold. Returns the number submitted."""
    from intellect_protocol.node.work import finish, finisher_pool, generate  # torch and the model load only when there is work

    in_flight = threading.Semaphore(client.api.status.max_leases_per_node)
    working_on: set[str] = set()
    uploads: queue.Queue[tuple[TaskSpec, Future[TaskResult]] | None] = queue.Queue()
    done = 0
    failure: list[BaseException] = []
    waiting: dict[str, str] = {}
    """Why the coordinator last gave no work (``reason``), until work comes again."""
    retry_after = idle_wait
    """When the coordinator said to ask again, at most ``idle_wait`` (a run waiting for its trainer clears in a second)."""

    def uploader() -> None:
        nonlocal done
        while (item := uploads.get()) is not None:
            task, finishing = item
            try:
                result = finishing.result()
                receipt = client.submit(task.task_id, result.data)
            except TaskLost as e:
                console.print(f"[yellow]Task {task.task_id} dropped: {e}[/yellow]")
                continue
            except Stopped:
                return
            except BaseException as e:  # raised again on the main thread
                failure.append(e)
                stop.set()
                return
            finally:
                working_on.discard(task.task_id)
                in_flight.release()
                if weights is not None:
                    weights.unpin(task)
            done += 1
            if on_done is not None:
                on_done(result)
            rate = result.tokens / result.generate_s if result.generate_s else 0.0
            if beats is not None:
                beats.metrics = {"tasks_done": done, "tokens_per_s": round(rate, 1), "last_reward": round(result.mean_reward, 4)}
            console.print(
                f"Task {done} ({task.task_id[:13]}…): {result.rollouts} rollouts, {result.tokens} tokens at {rate:.0f} tok/s, "
                f"mean reward {result.mean_reward:.2f}; submitted as {receipt.submission_id[:12]}… ({receipt.status})."
            )

    def lease_next() -> TaskSpec | None:
        """Take a free slot and lease a task into it (the slot goes back when there is none)."""
        nonlocal retry_after
        while not in_flight.acquire(timeout=0.5):
            if stop.is_set():
                return None
        try:
            leased = client.lease(sorted(working_on))
        except TaskLost as e:  # the coordinator counts more tasks held than this process knows of
            console.print(f"[yellow]No task now: {e}[/yellow]")
            leased = None
        except BaseException:
            in_flight.release()
            raise
        if isinstance(leased, WorkWait):
            if waiting.get("reason") != leased.reason:  # once per reason, not at every poll
                console.print(f"[yellow]No new work: {leased.message}.[/yellow]")
            waiting["reason"] = leased.reason
            retry_after = min(idle_wait, leased.retry_after_s)
            leased = None
        elif leased is not None and waiting.pop("reason", ""):
            console.print("Work again.")
        if leased is None:
            in_flight.release()
        else:
            working_on.add(leased.task_id)
        return leased

    thread = threading.Thread(target=uploader, name="uploader", daemon=True)
    thread.start()
    prefetcher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lease")
    own_finishers = finishers is None
    finishers = finishers or finisher_pool()
    upcoming: Future[TaskSpec | None] | None = None
    leased = 0
    try:
        while not stop.is_set() and (max_tasks is None or leased < max_tasks):
            task = upcoming.result() if upcoming is not None else lease_next()
            upcoming = None
            if task is None:
                if beats is not None:
                    beats.activity = f"waiting: {waiting['reason']}" if waiting else "idle"
                stop.wait(retry_after if waiting else idle_wait)
                continue
            leased += 1
            if max_tasks is None or leased < max_tasks:
                upcoming = prefetcher.submit(lease_next)  # the next lease's round trip hides behind this generation
            if weights is not None and task.policy_step > 0:
                if beats is not None:
                    beats.activity = "downloading"
                try:
                    task = task.model_copy(update={"model": weights.model_for(task, pin=True)})
                except DownloadError as e:
                    # The step is gone from every relay (the run moved on) or none answers now: this
                    # task is lost to us; its lease runs out and the coordinator decides what comes next.
                    console.print(f"[yellow]Task {task.task_id} dropped: {e}.[/yellow]")
                    working_on.discard(task.task_id)
                    in_flight.release()
                    stop.wait(idle_wait)
                    continue
            if beats is not None:
                beats.activity = "generating"
            uploads.put((task, finishers.submit(finish, generate(task, backend, dtype))))
    except NotRegistered:
        stop.wait(idle_wait)  # the heartbeat thread registers again; the caller loops
    except KeyboardInterrupt:
        # Asked to stop: finished work gets a few seconds to upload; the rest is left to its lease's expiry.
        uploads.put(None)
        thread.join(STOP_GRACE_S)
        stop.set()
        raise
    except Stopped:
        if not failure:
            raise
        # The uploader failed and set ``stop``; its error, raised below, is the one to report.
    finally:
        # A task leased ahead but never started stays held: the next lease hands it back, or its lease runs out.
        prefetcher.shutdown(wait=True)
        uploads.put(None)
        thread.join()
        if own_finishers:
            finishers.shutdown(wait=True)
    if failure:
        raise failure[0]
    return done


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
