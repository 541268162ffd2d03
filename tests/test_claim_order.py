"""Which review a validator is handed first: a flood of fresh wallets' files (round four's sybils) waits behind
the work of nodes with an accepted file, for a bounded time, so it neither holds up honest work nor starves a
new honest node."""

from __future__ import annotations

from pathlib import Path

import pytest
from eth_account import Account

from intellect_protocol.coordinator.services.review_order import NEWCOMER_WAIT_S
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

        def claim(limit: int) -> list[str]:
            """Claim up to ``limit`` reviews and accept each; their submissions, in the order drawn."""
            body = {"address": validator.address, "limit": limit}
            drawn = signed_post(served.url, "/v1/validation/claim", validator, served.audience, body).json()
            for c in drawn:
                verdict = verdict_body(served.audience, validator, c, checks_for("accept"))
                assert signed_post(served.url, "/v1/validation/verdicts", validator, served.audience, verdict).status_code == 200
            return [c["submission_id"] for c in drawn]

        proven = joined(served)
        first = submit(proven)
        assert claim(1) == [first]  # accepted: the node has a record now
        newcomers = [submit(joined(served)) for _ in range(3)]
        clock.advance(1)
        honest = [submit(proven), submit(proven)]
        # The newest files, yet first: their node has a record.
        assert claim(3) == [*honest, newcomers[0]]
        clock.advance(NEWCOMER_WAIT_S)
        later = submit(proven)
        # Past the wait, the newcomers' files are drawn like anyone's, the oldest first.
        assert claim(4) == [*newcomers[1:], later]
