"""Which review a validator is handed first: a flood of fresh wallets' files (round four's sybils) waits behind
the work of nodes with an accepted file, for a bounded time, so it neither holds up honest work nor starves a
new honest node."""

from __future__ import annotations

from pathlib import Path

import pytest
from eth_account import Account

from intellect_protocol.coordinator.services.committee import NEWCOMER_WAIT_S
from intellect_protocol.coordinator.settings import CoordinatorSettings
from intellect_protocol.node.work import finish, generate
from intellect_protocol.shared.run_schemas import AuditPolicy
from intellect_protocol.shared.schemas import SamplingParams
from tests.conftest import admin_token, serve
from tests.helpers import checks_for, make_run, signed_post, verdict_body
from tests.support.clock import MovableClock
from tests.support.protocol import grant, joined, lease, upload

pytestmark = pytest.mark.integration


def test_newcomers_files_wait_behind_proven_nodes_work_for_a_bounded_time(sqlite_url: str, tmp_path: Path) -> None:
    clock = MovableClock()
    settings = CoordinatorSettings(
        database_url=sqlite_url,
        blob_dir=tmp_path / "blobs",
        rate_limit_per_s=1000,
        rate_limit_burst=1000,
        heartbeat_interval_s=3600,
    )
    with serve(settings, clock=clock) as served:
        make_run(served, sampling=SamplingParams(max_tokens=4), audit=AuditPolicy(share=0, new_node_share=0, suspect_share=0))
        validator = Account.create()
        grant(served, admin_token(served), validator.address, "validator")

        def submit(node) -> str:
            task = lease(served, node)
            return upload(served, node, task, finish(generate(task)).data)

        def next_claim() -> str:
            reply = signed_post(
                served.url, "/v1/validation/claim", validator, served.audience, {"address": validator.address, "limit": 1}
            )
            [claim] = reply.json()
            body = verdict_body(served.audience, validator, claim, checks_for("accept"))
            assert signed_post(served.url, "/v1/validation/verdicts", validator, served.audience, body).status_code == 200
            return claim["submission_id"]

        proven = joined(served)
        first = submit(proven)
        assert next_claim() == first  # accepted: the node has a record now
        newcomers = [submit(joined(served)) for _ in range(3)]
        clock.advance(1)
        honest = submit(proven)
        assert next_claim() == honest  # the newest file, yet first: its node has a record
        clock.advance(NEWCOMER_WAIT_S)
        later = submit(proven)
        # Past the wait, the newcomers' files come first again, oldest first.
        assert [next_claim() for _ in range(4)] == [*newcomers, later]
