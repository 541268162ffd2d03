"""Roles forked warm (devnet/warm.py) behave as their console scripts started cold: argv as ``ps`` shows it,
the environment they were given, their log, a session of their own, their exit codes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from intellect_protocol.devnet.processes import free_port, script, spawn
from intellect_protocol.devnet.warm import WarmPopen
from intellect_protocol.shared.cpu_ledger import LEDGER_ENV, read_ledgers
from intellect_protocol.shared.wallet import THROWAWAY_SCRYPT_N, create_wallet
from tests.helpers import running_under, wait_for_text

LAUNCHER = """
import sys, time
from pathlib import Path
from intellect_protocol.devnet.processes import spawn
from intellect_protocol.shared import cpu_ledger  # as bench/learning.py imports it: recording where its environment says

if __name__ == "__main__":
    role_ledger, log, *args = sys.argv[1:]
    node = spawn("node", args, Path(log), {cpu_ledger.LEDGER_ENV: role_ledger, "INTELLECT_WALLET_PASSWORD": "pw"})
    deadline = time.monotonic() + 60
    while not (Path(log).exists() and "Cannot reach the coordinator" in Path(log).read_text()):
        assert time.monotonic() < deadline, "the node never tried the coordinator"
        time.sleep(0.1)
    sys.exit(node.stop())
"""


def test_a_warm_role_is_its_console_script_with_the_environment_it_was_given(tmp_path: Path) -> None:
    wallet = tmp_path / "node.json"
    create_wallet(wallet, "pw", scrypt_n=THROWAWAY_SCRYPT_N)
    args = [*script("intellect-node"), "join", "--wallet", str(wallet), "--coordinator", f"http://127.0.0.1:{free_port()}"]
    node = spawn("node", args, tmp_path / "node.log", {"INTELLECT_WALLET_PASSWORD": "pw"})
    assert isinstance(node.popen, WarmPopen)
    try:
        wait_for_text(node.log_path, "Cannot reach the coordinator", 60)
        assert os.getsid(node.popen.pid) == node.popen.pid
        assert [line.strip() for line in running_under(tmp_path)] == [" ".join(args)]
    finally:
        assert node.stop() == 0
    # The password comes from the role's own environment, and its error from its own stderr, into its log.
    wrong = spawn("node", args, tmp_path / "wrong.log", {"INTELLECT_WALLET_PASSWORD": "wrong"})
    assert wrong.popen.wait(60) == 1
    assert f"Wrong password for {wallet}." in wrong.tail()


def test_a_warm_role_imports_our_code_under_its_own_environment(tmp_path: Path) -> None:
    """multiprocessing imports the launcher's main module into each child before the role runs; whatever of our code
    that imported had read the forkserver's environment, not the role's: the second devnet of ``bench/learning.py``
    had its roles' CPU ledgers written into the first one's directory."""
    wallet = tmp_path / "node.json"
    create_wallet(wallet, "pw", scrypt_n=THROWAWAY_SCRYPT_N)
    (tmp_path / "launcher.py").write_text(LAUNCHER)
    node = [*script("intellect-node"), "join", "--wallet", str(wallet), "--coordinator", f"http://127.0.0.1:{free_port()}"]
    env = {**os.environ, LEDGER_ENV: str(tmp_path / "launcher")}
    launched = [sys.executable, str(tmp_path / "launcher.py"), str(tmp_path / "role"), str(tmp_path / "node.log"), *node]
    subprocess.run(launched, env=env, check=True, timeout=120)
    (role,) = read_ledgers(tmp_path / "role")
    assert role.program == "intellect-node" and "requests" in role.activities
    assert read_ledgers(tmp_path / "launcher") == []


def test_a_role_given_its_own_python_path_starts_cold_and_runs_its_sitecustomize(tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text("print('sitecustomize ran')\n")
    node = spawn("node", [*script("intellect-node"), "--help"], tmp_path / "node.log", {"PYTHONPATH": str(tmp_path)})
    assert isinstance(node.popen, subprocess.Popen)
    assert node.popen.wait(60) == 0
    assert "sitecustomize ran" in node.tail(100) and "join" in node.tail(100)
