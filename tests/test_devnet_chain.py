"""The devnet settling on a local chain (anvil): every node stakes before it works, epochs of final
credit anchor, a forging node is banned and then slashed, an honest node claims its reward with
``intellect-node claim``, ``verify-epoch`` rebuilds every root from the public ledger and finds the
chain's, and the leaderboard page shows epochs, stakes, slashes and claims in a real browser."""

from __future__ import annotations

import os
import time
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from intellect_protocol.devnet.chain import MIN_STAKE_TOKENS, NODE_STAKE, start_chain
from intellect_protocol.devnet.network import start_network
from intellect_protocol.devnet.processes import StartError
from intellect_protocol.node.cli import app as node_cli
from intellect_protocol.shared.money import TOKEN
from tests.helpers import chromium

pytestmark = pytest.mark.e2e


def test_a_chain_devnet_stakes_anchors_slashes_and_pays(tmp_path: Path) -> None:
    try:
        chain = start_chain(tmp_path)
    except StartError as e:
        if os.environ.get("CI"):
            pytest.fail(f"{e}; .ci/run must install it")
        pytest.skip(str(e))
    net = start_network(tmp_path, nodes=1, validators=2, chain=chain, coordinator_env={"INTELLECT_HEARTBEAT_INTERVAL_S": "1"})
    try:
        url = str(net.coordinator.url)
        assert httpx.get(f"{url}/v1/public/runs/{net.run_id}").json()["min_stake"] == str(MIN_STAKE_TOKENS * TOKEN)
        cheat = net.start_adversary()
        deadline = time.monotonic() + 420
        while True:
            overview = httpx.get(f"{url}/v1/public/settlement", timeout=30).json()
            anchored = [e for e in overview["epochs"] if e["tx_hash"]]
            slashed = {n["address"].lower(): int(n["slashed"]) for n in overview["nodes"]}
            if len(anchored) >= 2 and slashed.get(cheat.lower()):
                break
            assert time.monotonic() < deadline, (overview, chain.anvil.tail(), net.coordinator.tail())
            time.sleep(2)
        # The cheat's whole stake went to the distributor, citing the submissions that were rejected.
        assert slashed[cheat.lower()] == NODE_STAKE and chain.settlement.stake_of(cheat) == 0
        assert chain.settlement.registry.functions.slashed(cheat).call() == NODE_STAKE

        honest = net.by_name("node-0")
        wallet = net.workdir / "wallets" / "node-0.json"
        env = {"INTELLECT_WALLET_PASSWORD": net.password}
        claimed = CliRunner().invoke(node_cli, ["claim", "--wallet", str(wallet), "--coordinator", url], env=env)
        assert claimed.exit_code == 0 and "Claimed" in claimed.output, claimed.output + honest.tail()
        verified = CliRunner().invoke(node_cli, ["verify-epoch", "--coordinator", url])
        assert verified.exit_code == 0 and verified.output.count("matches the chain") >= 2, verified.output

        from playwright.sync_api import expect, sync_playwright

        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium(), args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto(f"{url}/")
            expect(page.locator("#epochs tbody tr").first).to_contain_text("block")
            expect(page.locator(f'#stakes tr[data-node="{cheat}" i] td').nth(3)).to_have_text("100.00")
            expect(page.locator(f'#stakes tr[data-node="{cheat}" i] td').nth(1)).to_have_text("0.00")
            claimed_cell = page.locator("#stakes tbody tr td:nth-child(6)").first
            expect(claimed_cell).not_to_have_text("0.00", timeout=15_000)  # the overview is cached for 5 s
            page.screenshot(path=str(tmp_path / "settlement.png"), full_page=True)
            browser.close()
    finally:
        net.stop()
