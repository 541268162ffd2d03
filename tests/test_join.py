"""``intellect-node join`` as a real subprocess against a real coordinator on loopback."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from intellect_protocol.coordinator.settings import CoordinatorSettings
from intellect_protocol.devnet.processes import Process, start_node
from intellect_protocol.shared.wallet import THROWAWAY_SCRYPT_N, create_wallet
from tests.conftest import FAST, admin_token, serve
from tests.helpers import HTTP, descendants, private_mib

PASSWORD = "test-password"


def wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def wallet(tmp_path: Path) -> tuple[Path, str]:
    path = tmp_path / "node.json"
    return path, create_wallet(path, PASSWORD, scrypt_n=THROWAWAY_SCRYPT_N)


def test_join_lifecycle(sqlite_url: str, tmp_path: Path, wallet: tuple[Path, str]) -> None:
    wallet_path, address = wallet
    with serve(CoordinatorSettings(database_url=sqlite_url, **FAST)) as c:
        auth = {"authorization": f"Bearer {admin_token(c, 'operate')}"}

        def node() -> dict:
            return HTTP.get(f"{c.url}/v1/admin/nodes/{address}", headers=auth).json()

        def status() -> str | None:
            return node().get("status")

        first = start_node(tmp_path, "node-1", wallet_path, c.url, PASSWORD)
        try:
            wait_for(lambda: status() == "healthy", 30, "the node to register and heartbeat")
            assert node()["specs"]["cpu_cores"] >= 1
            # With no run to serve, a node says so and loads no model code: its finisher idles, empty.
            wait_for(lambda: node()["last_heartbeat"]["activity"] == "waiting: no_run", 30, "the node to wait for a run")
            assert "No active run on this coordinator yet" in first.tail(50)
            (finisher,) = descendants(first.popen.pid)
            assert private_mib(finisher) < 16
            first.popen.send_signal(signal.SIGKILL)
            first.popen.wait()
            # Unhealthy lasts one second here, shorter than a poll can promise on a loaded runner: the node's
            # events say it passed through it on its way to dead.
            wait_for(lambda: status() == "dead", 20, "dead after the node died")
            assert [e["to_status"] for e in node()["events"]][:2] == ["dead", "unhealthy"]

            second = start_node(tmp_path, "node-1", wallet_path, c.url, PASSWORD)
            wait_for(lambda: status() == "healthy", 30, "healthy again after restart")
            assert "Resuming" in second.tail(50)
            events = [e["to_status"] for e in node()["events"]]
            assert events.count("registered") == 1
            assert events[:3] == ["healthy", "dead", "unhealthy"]

            # A clean stop on SIGTERM.
            second.popen.send_signal(signal.SIGTERM)
            assert second.popen.wait(15) == 0
            assert "Stopped." in second.tail()

            # A ban reaches the running node: it stops with its own exit code and a sentence.
            third = start_node(tmp_path, "node-1", wallet_path, c.url, PASSWORD)
            wait_for(lambda: "Resuming" in third.tail(50), 30, "the node to resume")
            HTTP.post(f"{c.url}/v1/admin/nodes/{address}/ban", json={"reason": "cheating"}, headers=auth).raise_for_status()
            assert third.popen.wait(15) == 3
            assert "banned by the coordinator's operator: cheating" in third.tail().replace("\n", " ")
        finally:
            for p in (first, locals().get("second"), locals().get("third")):
                if isinstance(p, Process):
                    p.stop()


def test_unreachable_coordinator_is_retried_with_a_sentence(tmp_path: Path, wallet: tuple[Path, str]) -> None:
    from intellect_protocol.devnet.processes import free_port

    wallet_path, _ = wallet
    node = start_node(tmp_path, "node-x", wallet_path, f"http://127.0.0.1:{free_port()}", PASSWORD)
    try:
        wait_for(lambda: node.tail().count("Cannot reach the coordinator") >= 2, 20, "two retries")
        assert node.popen.poll() is None
    finally:
        assert node.stop() == 0
    assert "Traceback" not in node.tail(100)


def test_wrong_password_is_one_line(tmp_path: Path, wallet: tuple[Path, str]) -> None:
    wallet_path, _ = wallet
    result = subprocess.run(
        ["intellect-node", "join", "--wallet", str(wallet_path), "--coordinator", "http://127.0.0.1:9"],
        capture_output=True,
        text=True,
        env={"PATH": __import__("os").environ["PATH"], "INTELLECT_WALLET_PASSWORD": "wrong"},
    )
    assert result.returncode == 1
    assert result.stderr.strip() == f"Wrong password for {wallet_path}."
