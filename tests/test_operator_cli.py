"""What an operator meets from the command line, through the real commands: a database that
cannot be used, a busy port and a mistyped URL are one sentence and a non-zero exit, never a
traceback or endless retries; a node that never reached its coordinator says so at once, and says
when its coordinator is back."""

from __future__ import annotations

import os
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest
from eth_account import Account

from intellect_protocol.devnet.processes import free_port, migrate, start_coordinator
from intellect_protocol.node.client import NodeClient
from intellect_protocol.node.settings import NodeSettings
from intellect_protocol.shared.wallet import THROWAWAY_SCRYPT_N, create_wallet


def _coordinator(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    if args[0] == "serve" and "--port" not in args:
        args = (*args, "--port", str(free_port()))  # the default port may be another test's
    return subprocess.run(
        ["intellect-coordinator", *args], capture_output=True, text=True, timeout=60, env={**os.environ, **(env or {})}
    )


def _one_sentence(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, result.stdout + result.stderr
    out = (result.stdout + result.stderr).strip()
    assert "Traceback" not in out and len(out.splitlines()) <= 2, out  # rich may wrap a long sentence once
    return " ".join(out.split())


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("postgresql://user@127.0.0.1:{port}/intellect", "Nothing answers at 127.0.0.1:{port}"),
        ("postgresql://user@host/intellect", "Cannot resolve the database host 'host'"),
        ("mysql://user@localhost/intellect", "The ledger runs on SQLite or PostgreSQL, not 'mysql'"),
        ("not a url", "is not a database URL"),
        ("sqlite:////nonexistent/dir/ledger.db", "Cannot open the SQLite file"),
    ],
)
@pytest.mark.parametrize("command", ["migrate", "serve"])
def test_a_database_that_cannot_be_used_is_one_sentence(command: str, url: str, says: str) -> None:
    port = free_port()
    message = _one_sentence(_coordinator(command, "--database-url", url.format(port=port)))
    assert says.format(port=port) in message


def test_a_missing_postgresql_driver_names_the_extra(tmp_path: Path) -> None:
    # psycopg stands in as missing: an import of it fails as it would were it not installed.
    (tmp_path / "psycopg").mkdir()
    (tmp_path / "psycopg" / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'psycopg'\", name='psycopg')\n"
    )
    for command in ("migrate", "serve"):
        message = _one_sentence(
            _coordinator(command, "--database-url", "postgresql://u@127.0.0.1/x", env={"PYTHONPATH": str(tmp_path)})
        )
        assert "pip install 'intellect-protocol[postgres]'" in message


def test_a_busy_port_fails_before_the_app_starts(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    migrate(url, tmp_path / "migrate.log")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        result = _coordinator("serve", "--port", str(taken.getsockname()[1]), "--database-url", url)
    message = _one_sentence(result)
    assert "is in use" in message and "--port" in message and "startup complete" not in message


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("localhost:8000", "did you mean http://localhost:8000?"),
        ("htp://127.0.0.1:8000", "did you mean http://127.0.0.1:8000?"),
        ("http//127.0.0.1:8000", "did you mean http://127.0.0.1:8000?"),
        ("http://nowhere.invalid:8000", "does not resolve"),
        ("http://127.0.0.1:8000/v1", "give its base URL, http://127.0.0.1:8000,"),
        ("http://127.0.0.1:8000/v1/public/status", "give its base URL, http://127.0.0.1:8000,"),
    ],
)
def test_a_coordinator_url_that_can_never_work_is_refused_at_once(url: str, says: str, tmp_path: Path) -> None:
    wallet = tmp_path / "w.json"
    create_wallet(wallet, "pw", scrypt_n=THROWAWAY_SCRYPT_N)
    started = time.monotonic()
    result = subprocess.run(
        ["intellect-node", "join", "--wallet", str(wallet), "--coordinator", url, "--state-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "INTELLECT_WALLET_PASSWORD": "pw"},
    )
    assert result.returncode == 2 and time.monotonic() - started < 30
    assert says in " ".join(result.stderr.replace("│", " ").split()), result.stderr


def test_a_node_says_when_its_coordinator_is_back(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    migrate(url, tmp_path / "logs" / "migrate.log")
    coordinator = start_coordinator(tmp_path, url)
    notices: list[str] = []
    client = NodeClient(
        coordinator.url,
        Account.create(),
        NodeSettings(state_dir=tmp_path, backoff_initial_s=0.2, backoff_max_s=0.5),
        on_retry=notices.append,
    )
    try:
        client.public_status()
        coordinator.kill()
        reached = threading.Thread(target=client.public_status)
        reached.start()
        while not any("Cannot reach" in n for n in notices):
            time.sleep(0.05)
        coordinator.restart()
        reached.join(30)
        assert not reached.is_alive()
        assert "answers again" in notices[-1] and notices[-1].startswith(f"The coordinator at {coordinator.url}")
        # It answered before: the URL is right, so nothing suggests checking it.
        assert not any("has not answered once" in n for n in notices), notices
    finally:
        client.close()
        coordinator.stop()


def test_a_node_that_never_reached_its_coordinator_says_so_within_seconds(tmp_path: Path) -> None:
    wallet = tmp_path / "wallet.json"
    create_wallet(wallet, "pw", scrypt_n=THROWAWAY_SCRYPT_N)
    url = f"http://127.0.0.1:{free_port()}"  # a mistyped port: nothing listens
    command = ["intellect-node", "join", "--wallet", str(wallet), "--coordinator", url, "--state-dir", str(tmp_path / "state")]
    env = {**os.environ, "INTELLECT_WALLET_PASSWORD": "pw", "COLUMNS": "240"}
    node = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    said: list[str] = []
    reader = threading.Thread(target=lambda: said.extend(iter(node.stdout.readline, "")), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 20  # the node's own start (imports, wallet) included
        while not any("has not answered once" in line for line in said) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert node.poll() is None, "".join(said)  # it keeps retrying: the coordinator may be starting
    finally:
        node.terminate()
        node.wait(30)
    line = next((line for line in said if "has not answered once" in line), "")
    assert url in line and "check the URL" in line and f"curl {url}/healthz" in line, "".join(said)
    assert node.returncode == 0, "".join(said)
