"""The leaderboard page on a young network, in Chromium: a chart of one point keeps a sensible axis,
the accuracy chart says when its last point trails the run, the status panel says why nodes get
no new work, and a pretraining run shows its held-out loss and each island's tokens."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import pytest
from playwright.sync_api import expect, sync_playwright

from intellect_protocol.coordinator.db import make_sessionmaker
from intellect_protocol.coordinator.island_models import Island, IslandShare
from intellect_protocol.coordinator.models import Run, Submission, TrainerMetrics
from intellect_protocol.coordinator.services.learning_signal import MIN_GROUPS, PATIENCE_S
from intellect_protocol.coordinator.services.runs import create_run
from intellect_protocol.node.work import finish, generate
from intellect_protocol.shared.pretraining.manifest import CorpusManifest, ShardRef
from intellect_protocol.shared.run_schemas import RunSpec
from intellect_protocol.shared.states import RunKind, ShareState, SubmissionStatus
from tests.conftest import ON_POSTGRES_ONLY, Served, admin_token
from tests.helpers import HTTP, chromium, make_run
from tests.support.protocol import joined, lease, upload

# What the page reads is the public API, whose queries run on both kinds of ledger in the integration stage.
pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("e2e-a"), ON_POSTGRES_ONLY]


def test_one_point_and_the_reason_no_work_comes(coordinator: Served) -> None:
    run_id = make_run(coordinator, name="young")
    headers = {"authorization": f"Bearer {admin_token(coordinator)}"}
    reply = HTTP.post(
        f"{coordinator.url}/v1/admin/runs/{run_id}/evaluations",
        json={"step": 0, "metrics": {"heldout_accuracy": 0.67}},
        headers=headers,
    )
    assert reply.status_code == 201
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium(), args=["--no-sandbox"])
        page = browser.new_page()
        page.goto(f"{coordinator.url}/")
        chart = page.locator("figure", has_text="Held-out accuracy").locator("svg.chart")
        expect(chart).to_have_attribute("data-points", "1")
        top, bottom = (float(t) for t in chart.locator("text").all_text_contents()[:2])
        assert 0.6 <= bottom < 0.67 < top <= 0.75, (bottom, top)  # not 0.17..1.17 around one value
        expect(page.locator("#stat-work")).to_have_text("handed out")
        expect(page.locator("figure", has_text="Held-out accuracy").locator("figcaption")).to_have_text("Held-out accuracy")
        note = page.locator("figure", has_text="Held-out accuracy").locator(".chart-note")
        expect(note).to_have_text("Mean reward on arithmetic's held-out problems, greedy")

        # The trainer moves on while step 0 is still the last one evaluated: the chart says so.
        with make_sessionmaker(coordinator.engine).begin() as session:
            for step in (1, 2, 3):
                session.add(TrainerMetrics(run_id=run_id, step=step, metrics={"reward": 0.5}, created_at=datetime.now(UTC)))
        page.reload()
        caption = page.locator("figure", has_text="Held-out accuracy").locator("figcaption")
        expect(caption).to_have_text("Held-out accuracy (last measured at step 0; the run is at 3)")

        # Evaluations under a thinking budget also count the completions kept to it: a line of its own, drawn only then.
        accuracy = page.locator("figure", has_text="Held-out accuracy")
        assert "within the thinking budget" not in (accuracy.locator("svg.chart").get_attribute("aria-label") or "")
        metrics = {"heldout_accuracy": 0.7, "heldout_within_budget": 0.25}
        reply = HTTP.post(
            f"{coordinator.url}/v1/admin/runs/{run_id}/evaluations", json={"step": 3, "metrics": metrics}, headers=headers
        )
        assert reply.status_code == 201
        page.reload()
        expect(accuracy.locator(".legend")).to_contain_text("within the thinking budget")
        label = accuracy.locator("svg.chart").get_attribute("aria-label") or ""
        assert "within the thinking budget: 1 points, last 0.25" in label, label

        assert HTTP.post(f"{coordinator.url}/v1/admin/runs/{run_id}/pause", headers=headers).status_code == 200
        page.reload()
        work = page.locator("#stat-work")
        expect(work).to_have_text("run young is paused by its operator")
        expect(work).to_have_attribute("title", "run young is paused by its operator")
        # A long reason stays within its card: the row of cards keeps its height.
        assert work.evaluate("e => e.scrollHeight <= e.clientHeight + 1")
        browser.close()


def test_a_run_that_cannot_learn_says_so_above_its_charts(coordinator: Served) -> None:
    """Round four of use: a model that never earned a reward ran for minutes at step 0 while the page said nothing."""
    run_id = make_run(coordinator, name="flat", prompts=1, samples=2)
    node = joined(coordinator)
    task = lease(coordinator, node)
    submission = upload(coordinator, node, task, finish(generate(task)).data)
    with make_sessionmaker(coordinator.engine).begin() as session:
        # As if validators had accepted MIN_GROUPS groups without a spread over a minute ago.
        session.get_one(Run, run_id).created_at -= timedelta(seconds=2 * PATIENCE_S)
        row = session.get_one(Submission, submission)
        row.status, row.validated_at = SubmissionStatus.accepted, datetime.now(UTC) - timedelta(seconds=PATIENCE_S + 5)
        row.groups, row.flat_groups, row.task_reward_sum, row.rows = MIN_GROUPS, MIN_GROUPS, 0.0, 2 * MIN_GROUPS
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium(), args=["--no-sandbox"])
        page = browser.new_page()
        page.goto(f"{coordinator.url}/")
        alert = page.locator("#learning-stalled")
        expect(alert).to_contain_text(f"No learning signal: {MIN_GROUPS} groups accepted since policy step 0")
        expect(alert).to_contain_text("partial credit")
        # The throughput chart starts at the run's first upload, not at a bucket of nothing before it.
        expect(page.locator("figure", has_text="Throughput").locator("svg.chart")).to_have_attribute("data-points", "1")
        browser.close()


def test_without_scripts_the_page_still_shows_the_run_its_figures_and_its_nodes(coordinator: Served) -> None:
    make_run(coordinator, name="plain")
    node = joined(coordinator)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium(), args=["--no-sandbox"])
        page = browser.new_context(java_script_enabled=False).new_page()  # a text browser, a headless screenshot
        page.goto(f"{coordinator.url}/")
        expect(page.locator("#run-name")).to_have_text("Run plain · arithmetic · tiny-arith")
        expect(page.locator("#stat-policy-step")).to_have_text("0")
        expect(page.locator("#stat-work")).to_have_text("handed out")
        row = page.locator(f'#leaderboard tr[data-address="{node.address}"]')
        expect(row.locator("td").nth(2)).to_have_text("0.00")
        browser.close()


def test_a_pretraining_run_shows_its_held_out_loss_and_each_islands_tokens(coordinator: Served) -> None:
    def ref(i: int) -> ShardRef:
        return ShardRef(sha256=f"{i:064x}", rows=4, tokens=100 * i)

    corpus = CorpusManifest(
        name="meta", seq_len=8, vocab_size=16, pad_id=0, tokenizer_sha256="0" * 64, shards=[ref(1), ref(2)], held_out=ref(3)
    )
    now = datetime.now(UTC)
    with make_sessionmaker(coordinator.engine).begin() as session:
        run = create_run(session, RunSpec(name="meta", kind=RunKind.pretrain, corpus=corpus), now)
        run.policy_step = 2
        session.flush()  # the run's row before the rows that name it
        for step, loss, auroc in ((1, 4.1, 0.6), (2, 3.7, 0.74)):
            metrics = {"held_out_loss": loss, "perplexity": math.exp(loss), "ood_auroc": auroc, "step_s": 3.0}
            session.add(TrainerMetrics(run_id=run.id, step=step, metrics=metrics, created_at=now))
        session.add(Island(run_id=run.id, name="east", address="0x" + "1" * 40, joined_at=now, last_seen=now, outer_step=1))
        session.add(IslandShare(run_id=run.id, cursor=2, island="east", state=ShareState.consumed, claimed_at=now))
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium(), args=["--no-sandbox"])
        page = browser.new_page()
        page.goto(f"{coordinator.url}/")
        loss = page.locator("figure", has_text="Held-out loss per policy step").locator("svg.chart")
        expect(loss).to_have_attribute("data-points", "2")
        assert "last 3.7" in (loss.get_attribute("aria-label") or "")
        auroc = page.locator("figure", has_text="Out-of-distribution AUROC").locator("svg.chart")
        expect(auroc).to_have_attribute("data-points", "2")
        expect(page.locator("figure", has_text="Reward per policy step")).to_have_count(0)  # no rollouts, no rewards
        # Slot 2 is the second shard's first epoch: its 200 tokens are the island's.
        expect(page.locator("#islands th").nth(6)).to_have_text("Tokens")
        expect(page.locator('#islands tr[data-island="east"] td').nth(6)).to_have_text("200")
        browser.close()
