"""The node's work loop stage by stage: slots, lease, generate and prove, upload, against a real coordinator."""

from __future__ import annotations

import io
import os
import threading
import time
from pathlib import Path

import pytest
from eth_account import Account
from rich.console import Console

from intellect_protocol.coordinator.settings import CoordinatorSettings
from intellect_protocol.node.client import NodeClient
from intellect_protocol.node.hardware import probe
from intellect_protocol.node.settings import NodeSettings
from intellect_protocol.node.work_loop import Slots, WorkLoop
from intellect_protocol.shared.schemas import SamplingParams
from tests.conftest import serve
from tests.helpers import make_run


@pytest.mark.unit
def test_slots_hold_at_most_their_limit_and_give_back_what_was_taken() -> None:
    slots, stop = Slots(2), threading.Event()
    assert slots.take(stop) and slots.take(stop)
    slots.hold("t-b")
    slots.hold("t-a")
    assert slots.held() == ["t-a", "t-b"]

    third: list[bool] = []
    waiter = threading.Thread(target=lambda: third.append(slots.take(stop)))
    waiter.start()
    time.sleep(0.7)
    assert third == []  # full: the third waits
    slots.release("t-a")
    waiter.join(5)
    assert third == [True] and slots.held() == ["t-b"]

    slots.release()  # the third got no task
    slots.release("t-b")
    assert slots.held() == []
    assert slots.take(stop) and slots.take(stop)
    stop.set()
    assert slots.take(stop) is False  # full, and asked to stop: gives up


def _node(served, tmp_path: Path) -> NodeClient:
    client = NodeClient(served.url, Account.create(), NodeSettings(state_dir=tmp_path / "node"))
    client.public_status()
    client.register(probe(tmp_path / "node"), None)
    return client


def test_each_stage_hands_on_to_the_next_and_the_slot_follows_the_task(sqlite_url: str, tmp_path: Path) -> None:
    from intellect_protocol.node.finishers import finisher_pool, stop_finishers

    settings = CoordinatorSettings(database_url=sqlite_url, blob_dir=tmp_path / "blobs", max_leases_per_node=2)
    with serve(settings) as served:
        client, out = _node(served, tmp_path), io.StringIO()
        loop = WorkLoop(client, Console(file=out, width=300), threading.Event(), idle_wait=0.1)

        # No run yet: the lease stage says why, once, and gives its slot back.
        assert loop.lease() is None and loop.lease() is None
        assert loop.waiting.reason == "no_run" and out.getvalue().count("No new work") == 1
        assert loop.slots.held() == []

        make_run(served, sampling=SamplingParams(max_tokens=8), prompts=1, samples=2)
        task = loop.lease()
        assert task is not None and loop.waiting.reason is None and "Work again." in out.getvalue()
        assert loop.slots.held() == [task.task_id]
        assert loop.with_weights(task) is task  # step 0: the run's own model, nothing to fetch

        finishers = finisher_pool()
        try:
            loop.generate(task, finishers)
            queued, finishing = loop.uploads.get_nowait()
            assert queued is task and finishing.result(timeout=120).rollouts == 2
            loop.upload(queued, finishing)
        finally:
            stop_finishers(finishers)
            client.close()
        assert loop.done == 1 and loop.slots.held() == []
        assert "submitted as sub-" in out.getvalue()


def test_a_failed_upload_stops_the_loop_and_is_raised_on_the_calling_thread(sqlite_url: str, tmp_path: Path) -> None:
    from intellect_protocol.node.finishers import finisher_pool, stop_finishers

    with serve(CoordinatorSettings(database_url=sqlite_url, blob_dir=tmp_path / "blobs")) as served:
        make_run(served, sampling=SamplingParams(max_tokens=8), prompts=1, samples=2)
        client, stop = _node(served, tmp_path), threading.Event()
        finishers = finisher_pool()
        loop = WorkLoop(client, Console(file=io.StringIO(), width=300), stop, idle_wait=0.1, finishers=finishers)
        try:
            broken = finishers.submit(int, "not a number")  # the prove stage fails
            task = loop.lease()
            assert task is not None
            loop.uploads.put((task, broken))
            with pytest.raises(ValueError):
                loop.run(max_tasks=0)
        finally:
            stop_finishers(finishers)
            client.close()
        assert stop.is_set() and loop.slots.held() == []


def test_the_first_lease_waits_for_the_finisher(sqlite_url: str, tmp_path: Path) -> None:
    """A lease's clock (and its policy's staleness) must not run while the node's finisher is still starting."""
    from datetime import UTC, datetime

    from sqlalchemy import select

    import intellect_protocol.node.work  # noqa: F401  (loaded here, so the loop's own import of it is instant)
    from intellect_protocol.coordinator.models import Task
    from intellect_protocol.node.finishers import finisher_pool, stop_finishers

    busy_s = 3.0
    with serve(CoordinatorSettings(database_url=sqlite_url, blob_dir=tmp_path / "blobs")) as served:
        make_run(served, sampling=SamplingParams(max_tokens=8), prompts=1, samples=2)
        client, stop = _node(served, tmp_path), threading.Event()
        finishers = finisher_pool()
        try:
            finishers.submit(os.getpid).result(timeout=120)  # up: from here, only the sleep below holds it
            started = datetime.now(UTC)
            finishers.submit(time.sleep, busy_s)  # not free yet, as while it imports torch on a slow machine
            loop = WorkLoop(client, Console(file=io.StringIO(), width=300), stop, idle_wait=0.1, finishers=finishers)
            assert loop.run(max_tasks=1) == 1
        finally:
            stop_finishers(finishers)
            client.close()
        with served.engine.connect() as db:
            leased_at = db.scalar(select(Task.leased_at).where(Task.leased_at.is_not(None)))
        assert (leased_at.replace(tzinfo=UTC) - started).total_seconds() >= busy_s - 0.1
