"""The node's client turns coordinator refusals into sentences; `intellect-node check`."""

from __future__ import annotations

import re
import subprocess
import threading
from pathlib import Path

import pytest
from eth_account import Account
from rich.console import Console

from intellect_protocol.coordinator.settings import CoordinatorSettings
from intellect_protocol.node.client import EXIT_CLOCK, EXIT_VERSION, NodeClient, NodeError
from intellect_protocol.node.finishers import finisher_pool, stop_finishers
from intellect_protocol.node.hardware import probe
from intellect_protocol.node.settings import NodeSettings
from intellect_protocol.node.worker import join
from intellect_protocol.shared.signing import SignedAuth
from tests.conftest import serve


def test_clock_skew_is_explained(coordinator, tmp_path: Path) -> None:
    client = NodeClient(coordinator.url, Account.create(), NodeSettings(state_dir=tmp_path))
    client.public_status()
    client.api._auth = SignedAuth(client.account, coordinator.audience, clock_offset=-1000)  # a clock 1000 s slow
    with pytest.raises(NodeError) as refused:
        client.register(probe(tmp_path), None)
    assert refused.value.exit_code == EXIT_CLOCK
    assert re.search(r"clock is -(999|1000|1001) s off", str(refused.value))
    assert coordinator.snapshot()["nodes"] == []


def test_too_old_for_the_coordinator(sqlite_url: str, tmp_path: Path) -> None:

    with serve(CoordinatorSettings(database_url=sqlite_url, min_node_version="99.0.0")) as c:
        finishers = finisher_pool()
        try:
            with pytest.raises(NodeError) as refused:
                join(
                    Account.create(),
                    c.url,
                    NodeSettings(state_dir=tmp_path),
                    Console(file=open("/dev/null", "w")),
                    stop=threading.Event(),
                    finishers=finishers,
                )
        finally:
            stop_finishers(finishers)
        assert refused.value.exit_code == EXIT_VERSION
        assert "pip install -U intellect-protocol" in str(refused.value)


def test_check_command(sqlite_url: str, tmp_path: Path) -> None:
    # The node never sees the coordinator's database: one kind is enough.
    with serve(CoordinatorSettings(database_url=sqlite_url, blob_dir=tmp_path / "blobs")) as coordinator:
        _check(coordinator.url, tmp_path)


def _check(url: str, tmp_path: Path) -> None:
    ok = subprocess.run(
        ["intellect-node", "check", "--coordinator", url, "--state-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "CPU cores" in ok.stdout and "Ready to join" in ok.stdout
    from intellect_protocol.devnet.processes import free_port

    down = subprocess.run(
        ["intellect-node", "check", "--coordinator", f"http://127.0.0.1:{free_port()}", "--state-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert down.returncode == 1
    assert "not reachable" in down.stderr


def test_a_node_holds_as_many_tasks_as_the_coordinator_allows(sqlite_url: str, tmp_path: Path) -> None:
    import io

    from intellect_protocol.node.work_loop import WorkLoop
    from intellect_protocol.shared.schemas import SamplingParams
    from tests.helpers import make_run

    with serve(CoordinatorSettings(database_url=sqlite_url, blob_dir=tmp_path / "blobs", max_leases_per_node=1)) as served:
        make_run(served, sampling=SamplingParams(max_tokens=8), prompts=1, samples=1)
        client = NodeClient(served.url, Account.create(), NodeSettings(state_dir=tmp_path / "node"))
        assert client.public_status().max_leases_per_node == 1
        client.register(probe(tmp_path / "node"), None)
        out = io.StringIO()
        finishers = finisher_pool()
        try:
            loop = WorkLoop(client, Console(file=out, width=300), threading.Event(), idle_wait=0.1, finishers=finishers)
            assert loop.run(max_tasks=3) == 3
        finally:
            stop_finishers(finishers)
            client.close()
        # Leasing a second task ahead would be refused: "This node already holds 1 tasks".
        assert "already holds" not in out.getvalue(), out.getvalue()
