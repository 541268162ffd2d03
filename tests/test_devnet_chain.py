"""`intellect-devnet --chain --adversary --model DIR`, as a user runs it, on a small Qwen3 model
made here (random weights: it never earns a reward, so no policy step; its honest work is all
accepted and credited all the same): every node stakes before it works,
epochs of final credit anchor, the forging node is banned and then slashed, an honest node claims
its reward with ``intellect-node claim``, ``verify-epoch`` rebuilds every root from the public
ledger and finds the chain's, and the leaderboard page shows epochs, stakes, slashes and claims in
a real browser. Then Ctrl-C, at a terminal, stops this working devnet (its most roles: anvil, two
validators, the cheat) promptly, every role on its own, leaving nothing running."""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from intellect_protocol.devnet.anvil import anvil_binary
from intellect_protocol.devnet.chain import MIN_STAKE_TOKENS, NODE_STAKE
from intellect_protocol.devnet.processes import StartError
from intellect_protocol.node.cli import app as node_cli
from intellect_protocol.shared.chain import Settlement, connect
from intellect_protocol.shared.money import TOKEN
from tests.families import build
from tests.helpers import HTTP, chromium, running_under, wait_for_text

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("e2e-b")]

PROMPT_S = 10.0


def _anvil_or_skip() -> None:
    try:
        anvil_binary()
    except StartError as e:
        if os.environ.get("CI"):
            pytest.fail(f"{e}; .ci/run must install it")
        pytest.skip(str(e))


def _node_cli(*args: str, env: dict[str, str] | None = None) -> str:
    result = CliRunner().invoke(node_cli, list(args), env=env)
    assert result.exit_code == 0, result.output
    return result.output


@pytest.mark.timeout(600)
def test_a_chain_devnet_stakes_anchors_slashes_pays_and_stops_at_ctrl_c(tmp_path: Path) -> None:
    _anvil_or_skip()
    workdir, output = tmp_path / "devnet", tmp_path / "devnet.out"
    model = build("qwen3", tmp_path / "qwen3")
    command = ["intellect-devnet", "--chain", "--adversary", "--model", str(model), "--nodes", "1", "--steps", "0"]
    command += ["--heartbeat-interval", "1"]
    with output.open("w") as out:
        # A session of its own, as at a terminal: Ctrl-C signals the whole foreground process group.
        devnet = subprocess.Popen(
            [*command, "--workdir", str(workdir)], stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        wait_for_text(output, "Leaderboard: ", 300)
        url = re.search(r"Leaderboard: (\S+)/", output.read_text())[1]
        contracts = json.loads((workdir / "chain.json").read_text())
        chain = Settlement.at(
            connect(contracts["rpc_url"]), contracts["token"], contracts["stake_registry"], contracts["distributor"]
        )
        run_id = HTTP.get(f"{url}/v1/public/runs").json()[0]["id"]
        run = HTTP.get(f"{url}/v1/public/runs/{run_id}").json()
        assert run["min_stake"] == str(MIN_STAKE_TOKENS * TOKEN) and run["model"] == str(model)
        # A model the network never saw is calibrated before its run opens, in the nodes' numerics only.
        assert list(run["tolerances"]) == ["torch/float32"] and "Calibrated torch/float32" in output.read_text()
        wait_for_text(workdir / "logs" / "adversary.log", "", 120)  # started once its wallet is staked
        cheat = "0x" + json.loads((workdir / "wallets" / "adversary.json").read_text())["address"]

        deadline = time.monotonic() + 420
        while True:
            overview = HTTP.get(f"{url}/v1/public/settlement", timeout=30).json()
            anchored = [e for e in overview["epochs"] if e["tx_hash"]]
            slashed = {n["address"].lower(): int(n["slashed"]) for n in overview["nodes"]}
            if len(anchored) >= 2 and slashed.get(cheat.lower()):
                break
            assert devnet.poll() is None and time.monotonic() < deadline, (overview, output.read_text()[-3000:])
            time.sleep(2)
        # The cheat's whole stake went to the distributor, citing the submissions that were rejected.
        assert slashed[cheat.lower()] == NODE_STAKE and chain.stake_of(cheat) == 0
        assert chain.registry.functions.slashed(cheat).call() == NODE_STAKE

        wallet = workdir / "wallets" / "node-0.json"
        password = (workdir / "wallet-password").read_text().strip()
        claimed = _node_cli("claim", "--wallet", str(wallet), "--coordinator", url, env={"INTELLECT_WALLET_PASSWORD": password})
        assert "Claimed" in claimed, claimed
        assert _node_cli("verify-epoch", "--coordinator", url).count("matches the chain") >= 2

        from playwright.sync_api import expect, sync_playwright

        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium(), args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto(f"{url}/")
            # Anchored epochs show their block; the newest (an epoch every 5 s) may still be waiting for the chain.
            expect(page.locator("#epochs tbody tr", has_text="block").first).to_be_visible()
            # "Earned" and the leaderboard's final credit differ in time, and the table says so.
            expect(page.locator("#stakes caption")).to_contain_text("Earned: final credit as of epoch ")
            expect(page.locator(f'#stakes tr[data-node="{cheat}" i] td').nth(3)).to_have_text("100.00")
            expect(page.locator(f'#stakes tr[data-node="{cheat}" i] td').nth(1)).to_have_text("0.00")
            claimed_cell = page.locator("#stakes tbody tr td:nth-child(6)").first
            expect(claimed_cell).not_to_have_text("0.00", timeout=15_000)  # the overview is cached for 5 s
            page.screenshot(path=str(tmp_path / "settlement.png"), full_page=True)
            browser.close()

        signalled = time.monotonic()
        os.killpg(devnet.pid, signal.SIGINT)
        devnet.wait(60)
        took = time.monotonic() - signalled
    finally:
        if devnet.poll() is None:  # failed before the Ctrl-C: still let the devnet stop its roles
            os.killpg(devnet.pid, signal.SIGTERM)
            try:
                devnet.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(devnet.pid, signal.SIGKILL)
    said = output.read_text()
    assert devnet.returncode == 0 and "Stopped." in said and "Traceback" not in said, said[-3000:]
    assert took < PROMPT_S, f"stopping took {took:.1f} s"
    codes = json.loads((workdir / "summary.json").read_text())["exit_codes"]
    assert {"anvil", "coordinator", "node-0", "adversary", "validator-0", "validator-1", "trainer"} <= set(codes), codes
    assert all(code == 0 for code in codes.values()), codes  # no role needed SIGKILL
    assert running_under(workdir) == []
    # Nothing an operator would read as an error at a slash or at the stop: web3's MismatchedABI (the slash's
    # receipt holds the token's Transfer too), "Bad file descriptor" (a long poll closed by the stop), uvicorn's
    # "Cancel 0 running task(s)".
    logs = {path.name: path.read_text(errors="replace") for path in (workdir / "logs").glob("*.log")}
    for words in ("MismatchedABI", "Bad file descriptor", "Cancel 0 running task"):
        assert not [name for name, text in logs.items() if words in text], words
    honest = "0x" + json.loads((workdir / "wallets" / "node-0.json").read_text())["address"]
    with sqlite3.connect(workdir / "ledger.db") as ledger:
        statuses = [s for (s,) in ledger.execute("SELECT status FROM submissions WHERE lower(address) = ?", (honest.lower(),))]
    assert statuses.count("accepted") >= 3 and "rejected" not in statuses, statuses
    with pytest.raises(httpx.TransportError):
        HTTP.post(contracts["rpc_url"], json={"jsonrpc": "2.0", "id": 1, "method": "eth_chainId", "params": []}, timeout=2)
