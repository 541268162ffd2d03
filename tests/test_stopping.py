"""SIGTERM stops the devnet promptly (under 10 s) while it starts, and every role even while it is
retrying a coordinator that went away or waiting on one that does not answer, leaving nothing running. Ctrl-C of a
working devnet is tested on the chain devnet (tests/test_devnet_chain.py), the one with the most roles to stop."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from intellect_protocol.devnet.network import Network
from intellect_protocol.devnet.processes import Process, admin_token, create_run, migrate, script, spawn, start_coordinator
from intellect_protocol.shared.wallet import THROWAWAY_SCRYPT_N, create_wallet
from tests.helpers import running_under, wait_for_text
from tests.support.stalling import stalling

PROMPT_S = 10.0


def _stopped(workdir: Path, log: str, says: str, send: Callable[[subprocess.Popen[str]], None]) -> tuple[int, str, float]:
    """Start the devnet (one node, one validator, a process group of its own as at a terminal),
    wait until ``log`` ``says`` something, signal it with ``send``; its exit code, output, and how
    long it took to exit after the signal."""
    command = ["intellect-devnet", "--nodes", "1", "--validators", "1", "--steps", "0", "--heartbeat-interval", "0.5"]
    devnet = subprocess.Popen(
        [*command, "--workdir", str(workdir)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        wait_for_text(workdir / "logs" / log, says, 300)
        signalled = time.monotonic()
        send(devnet)
        output, _ = devnet.communicate(timeout=60)
        return devnet.returncode, output, time.monotonic() - signalled
    finally:
        if devnet.poll() is None:
            devnet.kill()


@pytest.mark.e2e
@pytest.mark.xdist_group("e2e-a")
@pytest.mark.timeout(400)
def test_sigterm_while_the_devnet_starts_leaves_nothing_running(tmp_path: Path) -> None:
    workdir = tmp_path / "devnet"
    # Once the coordinator is spawned, the devnet waits for it to answer.
    code, output, took = _stopped(workdir, "coordinator.log", "", lambda devnet: devnet.send_signal(signal.SIGTERM))
    # No run began: the exit status says so, and the same --workdir starts afresh (nothing of this start is kept).
    assert code == 130 and "Interrupted before the network started" in output and "Traceback" not in output, output
    assert took < PROMPT_S, f"stopping took {took:.1f} s"
    assert running_under(workdir) == [] and list(workdir.iterdir()) == []


@pytest.mark.timeout(300)
def test_validator_and_trainer_stop_promptly_while_their_coordinator_is_gone(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    migrate(url, tmp_path / "logs" / "migrate.log")
    token = admin_token(url)
    run_id = create_run(url, "r", tmp_path / "logs" / "run.log")
    coordinator = start_coordinator(tmp_path, url)
    net = Network(tmp_path, url, token, run_id, "pw", [coordinator])
    roles: list[Process] = []
    try:
        for name in ("validator", "trainer"):
            wallet, address = (
                tmp_path / f"{name}.json",
                create_wallet(tmp_path / f"{name}.json", "pw", scrypt_n=THROWAWAY_SCRYPT_N),
            )
            net.grant(address, name)
            command = [*script(f"intellect-{name}"), "run", "--wallet", str(wallet), "--coordinator", coordinator.url]
            command += (
                ["--state-dir", str(tmp_path / name)]
                if name == "validator"
                else ["--run", run_id, "--origin-dir", str(tmp_path / "origin")]
            )
            roles.append(spawn(name, command, tmp_path / "logs" / f"{name}.log", {"INTELLECT_WALLET_PASSWORD": "pw"}))
        wait_for_text(roles[0].log_path, "Validating as", 120)
        wait_for_text(roles[1].log_path, "Training run-", 120)
        coordinator.kill()
        time.sleep(3)  # both are now retrying a coordinator that does not answer
        signalled = time.monotonic()
        for role in roles:
            role.popen.send_signal(signal.SIGTERM)
        for role in roles:
            role.popen.wait(60)
            assert role.popen.returncode == 0, role.tail()
        took = time.monotonic() - signalled
        assert took < PROMPT_S, f"stopping took {took:.1f} s"
    finally:
        for role in roles:
            role.stop()


@pytest.mark.timeout(300)
def test_sigterm_stops_a_validator_whose_claim_the_coordinator_never_answers(tmp_path: Path) -> None:
    """Its wait for work would last its client's read timeout (60 s): a stop must not wait it out. The claim goes back
    to the queue when it lapses, so stopping at once loses nothing."""
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    migrate(url, tmp_path / "logs" / "migrate.log")
    coordinator = start_coordinator(tmp_path, url)
    net = Network(tmp_path, url, admin_token(url), create_run(url, "r", tmp_path / "logs" / "run.log"), "pw", [coordinator])
    wallet = tmp_path / "validator.json"
    net.grant(create_wallet(wallet, "pw", scrypt_n=THROWAWAY_SCRYPT_N), "validator")
    try:
        with stalling(str(coordinator.url), "/v1/validation/claim") as (proxy, held):
            command = [*script("intellect-validator"), "run", "--wallet", str(wallet), "--coordinator", proxy]
            validator = spawn("validator", [*command, "--state-dir", str(tmp_path / "validator")], tmp_path / "validator.log",
                              {"INTELLECT_WALLET_PASSWORD": "pw"})  # fmt: skip
            try:
                assert held.wait(120), validator.tail()
                signalled = time.monotonic()
                validator.popen.send_signal(signal.SIGTERM)
                validator.popen.wait(90)
                took = time.monotonic() - signalled
            finally:
                validator.stop()
        assert validator.popen.returncode == 0 and "Stopped after 0 submissions." in validator.tail(), validator.tail()
        assert took < PROMPT_S, f"stopping took {took:.1f} s"
    finally:
        coordinator.stop()
