"""The node's client turns coordinator refusals into sentences; `intellect-node check`."""

from __future__ import annotations

import re
import subprocess
import threading
from pathlib import Path

import pytest
from eth_account import Account
from rich.console import Console

from node.client import EXIT_CLOCK, EXIT_VERSION, NodeClient, NodeError
from node.hardware import probe
from node.settings import NodeSettings
from node.worker import join
from shared.signing import SignedAuth


def test_clock_skew_is_explained(coordinator, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    client = NodeClient(coordinator.url, Account.create(), NodeSettings(state_dir=tmp_path))
    client.public_status()
    client.api._auth = SignedAuth(client.account, coordinator.audience, clock_offset=-1000)  # a clock 1000 s slow
    with pytest.raises(NodeError) as refused:
        client.register(probe(tmp_path), None)
    assert refused.value.exit_code == EXIT_CLOCK
    assert re.search(r"clock is -(999|1000|1001) s off", str(refused.value))
    assert coordinator.snapshot()["nodes"] == []


def test_too_old_for_the_coordinator(sqlite_url: str, tmp_path: Path) -> None:
    from coordinator.settings import CoordinatorSettings
    from tests.conftest import serve

    with serve(CoordinatorSettings(database_url=sqlite_url, min_node_version="99.0.0")) as c:
        with pytest.raises(NodeError) as refused:
            join(
                Account.create(),
                c.url,
                NodeSettings(state_dir=tmp_path),
                Console(file=open("/dev/null", "w")),
                stop=threading.Event(),
            )
        assert refused.value.exit_code == EXIT_VERSION
        assert "pip install -U intellect-protocol" in str(refused.value)


def test_check_command(coordinator, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    ok = subprocess.run(
        ["intellect-node", "check", "--coordinator", coordinator.url, "--state-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "CPU cores" in ok.stdout and "Ready to join" in ok.stdout
    from devnet.processes import free_port

    down = subprocess.run(
        ["intellect-node", "check", "--coordinator", f"http://127.0.0.1:{free_port()}", "--state-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert down.returncode == 1
    assert "not reachable" in down.stderr
