"""The node's work loop, in four stages that overlap so the protocol's work hides behind the model's:

1. **lease** (a helper thread, one task ahead): take a free :class:`Slots` slot and lease a task into it;
2. **generate** (the calling thread): fetch the task's policy weights if needed, then generate;
3. **prove** (``finishers``, a process pool, :mod:`node.finishers`): score, prove and write the file;
4. **upload** (the uploader thread): submit the file, then give the slot back.

A slot is held from the lease to the end of the upload (or to the moment the task is dropped), so
the node never holds more tasks than the coordinator lets it. Hand-offs are explicit: lease ->
generate by return value, generate -> prove -> upload through the ``uploads`` queue of
(task, future file) pairs, and any stage's fatal error through :attr:`WorkLoop.failure` and ``stop``.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from rich.console import Console

from intellect_protocol.node.client import NodeClient, NotRegistered, TaskLost
from intellect_protocol.node.finishers import finisher_pool, stop_finishers, wait_ready
from intellect_protocol.node.settings import BackendKind, Dtype
from intellect_protocol.shared.coordinator_client import Stopped
from intellect_protocol.shared.environments.bounded import PluginFailure
from intellect_protocol.shared.schemas import WorkWait
from intellect_protocol.shared.shardcast.client import DownloadError
from intellect_protocol.shared.shardcast.weights import Weights

if TYPE_CHECKING:
    from intellect_protocol.node.work import TaskResult
    from intellect_protocol.shared.schemas import TaskSpec

STOP_GRACE_S = 3.0
"""How long a node asked to stop keeps uploading work it already finished."""


class Activity(Protocol):
    """Where the loop reports what it is doing (the heartbeat thread sends it)."""

    activity: str
    metrics: dict[str, float]


class Slots:
    """The tasks this node holds at once: at most ``limit``, each from its lease until it is uploaded or dropped."""

    def __init__(self, limit: int) -> None:
        self._free = threading.Semaphore(limit)
        self._held: set[str] = set()
        self._lock = threading.Lock()

    def take(self, stop: threading.Event) -> bool:
        """Wait for a free slot; False if ``stop`` came first."""
        while not self._free.acquire(timeout=0.5):
            if stop.is_set():
                return False
        return True

    def hold(self, task_id: str) -> None:
        """The slot just taken now holds ``task_id``."""
        with self._lock:
            self._held.add(task_id)

    def release(self, task_id: str | None = None) -> None:
        """Give a slot back: the one holding ``task_id``, or one taken that got no task."""
        if task_id is not None:
            with self._lock:
                self._held.discard(task_id)
        self._free.release()

    def held(self) -> list[str]:
        """The tasks held now (the lease request names them: the coordinator hands back any others it counts)."""
        with self._lock:
            return sorted(self._held)


@dataclass
class LeaseOutcome:
    """What the last lease attempt said when it brought no task: ``reason`` (a :class:`WorkWait`
    reason) and how soon to ask again; None while work comes."""

    reason: str | None = None
    retry_after_s: float = 0.0


class WorkLoop:
    def __init__(
        self,
        client: NodeClient,
        console: Console,
        stop: threading.Event,
        *,
        idle_wait: float,
        activity: Activity | None = None,
        on_done: Callable[[TaskResult], None] | None = None,
        backend: BackendKind = "torch",
        dtype: Dtype = "float32",
        finishers: Executor | None = None,
        weights: Weights | None = None,
    ) -> None:
        """``idle_wait``: the longest pause before asking again for work; ``finishers``: the prove
        stage's pool (one is started and shut down per :meth:`run` when not given)."""
        self.client, self.console, self.stop = client, console, stop
        self.idle_wait = idle_wait
        self.activity, self.on_done = activity, on_done
        self.backend, self.dtype = backend, dtype
        self.finishers, self.weights = finishers, weights
        self.slots = Slots(client.api.status.max_leases_per_node)
        self.waiting = LeaseOutcome()
        self.uploads: queue.Queue[tuple[TaskSpec, Future[TaskResult]] | None] = queue.Queue()
        self.done = 0
        """Tasks submitted."""
        self.failure: BaseException | None = None
        """The first fatal error of the upload stage, raised again by :meth:`run`."""

    # Stage 1: lease.
    def lease(self) -> TaskSpec | None:
        """Take a free slot and lease a task into it; None (the slot given back) when there is none."""
        if not self.slots.take(self.stop):
            return None
        try:
            leased = self.client.lease(self.slots.held())
        except TaskLost as e:  # the coordinator counts more tasks held than this process knows of
            self.console.print(f"[yellow]No task now: {e}[/yellow]")
            leased = None
        except BaseException:
            self.slots.release()
            raise
        if isinstance(leased, WorkWait):
            if self.waiting.reason != leased.reason:  # once per reason, not at every poll
                self.console.print(f"[yellow]No new work: {leased.message}.[/yellow]")
            self.waiting = LeaseOutcome(leased.reason, min(self.idle_wait, leased.retry_after_s))
            leased = None
        elif leased is not None and self.waiting.reason is not None:
            self.console.print("Work again.")
            self.waiting = LeaseOutcome()
        if leased is None:
            self.slots.release()
        else:
            self.slots.hold(leased.task_id)
        return leased

    # Stage 2: generate (after the policy's weights are here).
    def with_weights(self, task: TaskSpec) -> TaskSpec | None:
        """``task`` pointed at its policy step's local weights; None (the task dropped) if no relay has them."""
        if self.weights is None or task.policy_step == 0:
            return task
        self._report("downloading")
        try:
            return task.model_copy(update={"model": self.weights.model_for(task, pin=True)})
        except DownloadError as e:
            # The step is gone from every relay (the run moved on) or none answers now: this task is
            # lost to us; its lease runs out and the coordinator decides what comes next.
            self.console.print(f"[yellow]Task {task.task_id} dropped: {e}.[/yellow]")
            self.slots.release(task.task_id)
            return None

    def generate(self, task: TaskSpec, finishers: Executor) -> None:
        """Generate ``task`` here and hand it to the prove stage, then to the upload stage."""
        from intellect_protocol.node.work import finish, generate  # torch and the model load only when there is work

        self._report("generating")
        self.uploads.put((task, finishers.submit(finish, generate(task, self.backend, self.dtype))))

    # Stage 4: upload (the prove stage is ``finish`` in the pool).
    def upload(self, task: TaskSpec, finishing: Future[TaskResult]) -> None:
        """Wait for ``task``'s file and submit it; the slot goes back whatever happens."""
        try:
            result = finishing.result()
            receipt = self.client.submit(task.task_id, result.data)
        except TaskLost as e:
            self.console.print(f"[yellow]Task {task.task_id} dropped: {e}[/yellow]")
            return
        except PluginFailure as e:  # the run's reward code failed, not this node: the task goes back, said once
            self.console.print(f"[yellow]Task {task.task_id} given back: {e}. {self._give_back(task, e)}[/yellow]")
            return
        finally:
            self.slots.release(task.task_id)
            if self.weights is not None:
                self.weights.unpin(task)
        self.done += 1
        if self.on_done is not None:
            self.on_done(result)
        rate = result.tokens / result.generate_s if result.generate_s else 0.0
        if self.activity is not None:
            self.activity.metrics = {
                "tasks_done": self.done,
                "tokens_per_s": round(rate, 1),
                "last_reward": round(result.mean_reward, 4),
            }
        self.console.print(
            f"Task {self.done} ({task.task_id[:13]}…): {result.rollouts} rollouts, {result.tokens} tokens at {rate:.0f} tok/s, "
            f"mean reward {result.mean_reward:.2f}; submitted as {receipt.submission_id[:12]}… ({receipt.status})."
        )

    def _give_back(self, task: TaskSpec, failure: PluginFailure) -> str:
        try:
            return self.client.give_back(task.task_id, failure)
        except TaskLost as e:
            return f"(It was lost already: {e}.)"

    def _uploader(self) -> None:
        while (item := self.uploads.get()) is not None:
            try:
                self.upload(*item)
            except Stopped:
                return
            except BaseException as e:  # raised again by run(), on the calling thread
                self.failure = e
                self.stop.set()
                return

    def _report(self, activity: str) -> None:
        if self.activity is not None:
            self.activity.activity = activity

    def run(self, max_tasks: int | None = None) -> int:
        """Work until ``stop`` (or ``max_tasks`` leased); returns the number of tasks submitted."""
        import intellect_protocol.node.work  # noqa: F401  (torch loads before the first lease, not with its clock running)

        owned: ProcessPoolExecutor | None = None
        if self.finishers is not None:
            finishers = self.finishers
        else:
            finishers = owned = finisher_pool()
        if not wait_ready(finishers, self.stop):
            if owned is not None:
                stop_finishers(owned)
            return self.done
        self._report("idle")
        self.console.print("Ready for work.")
        uploader = threading.Thread(target=self._uploader, name="uploader", daemon=True)
        uploader.start()
        prefetcher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lease")
        upcoming: Future[TaskSpec | None] | None = None
        leased = 0
        try:
            while not self.stop.is_set() and (max_tasks is None or leased < max_tasks):
                task = upcoming.result() if upcoming is not None else self.lease()
                upcoming = None
                if task is None:
                    self._report(f"waiting: {self.waiting.reason}" if self.waiting.reason else "idle")
                    self.stop.wait(self.waiting.retry_after_s if self.waiting.reason else self.idle_wait)
                    continue
                leased += 1
                if max_tasks is None or leased < max_tasks:
                    upcoming = prefetcher.submit(self.lease)  # the next lease's round trip hides behind this generation
                ready = self.with_weights(task)
                if ready is None:
                    self.stop.wait(self.idle_wait)
                    continue
                self.generate(ready, finishers)
        except NotRegistered:
            self.stop.wait(self.idle_wait)  # the heartbeat thread registers again; the caller runs the loop again
        except KeyboardInterrupt:
            # Asked to stop: finished work gets a few seconds to upload; the rest is left to its lease's expiry.
            self.uploads.put(None)
            uploader.join(STOP_GRACE_S)
            self.stop.set()
            raise
        except Stopped:
            if self.failure is None:
                raise
            # The uploader failed and set ``stop``; its error, raised below, is the one to report.
        finally:
            # A task leased ahead but never started stays held: the next lease hands it back, or its lease runs out.
            prefetcher.shutdown(wait=True)
            self.uploads.put(None)
            uploader.join()
            if owned is not None:
                owned.shutdown(wait=True)
        if self.failure is not None:
            raise self.failure
        return self.done
