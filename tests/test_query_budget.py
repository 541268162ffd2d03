"""Public and admin lists cost a bounded number of queries, however many receipts they hold."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
from eth_account import Account
from sqlalchemy import event
from sqlalchemy.engine import Engine

from intellect_protocol.coordinator.settings import CoordinatorSettings
from intellect_protocol.node.work import finish, generate
from intellect_protocol.shared.run_schemas import AuditPolicy
from intellect_protocol.shared.schemas import SamplingParams
from tests.conftest import LIFTED, Served, admin_token, serve
from tests.helpers import HTTP, checks_for, make_run, signed_post, verdict_body
from tests.support.protocol import grant, joined, lease, upload


@contextmanager
def counted() -> Iterator[list[str]]:
    """Every SQL statement any engine of this process runs meanwhile."""
    statements: list[str] = []

    def count(_conn, _cursor, statement, *_args) -> None:
        statements.append(statement)

    event.listen(Engine, "before_cursor_execute", count)
    try:
        yield statements
    finally:
        event.remove(Engine, "before_cursor_execute", count)


def _judged_submissions(served: Served, node, validator, count: int) -> None:
    for _ in range(count):
        task = lease(served, node)
        upload(served, node, task, finish(generate(task)).data)
        [claim] = signed_post(
            served.url, "/v1/validation/claim", validator, served.audience, {"address": validator.address, "limit": 1}
        ).json()
        body = verdict_body(served.audience, validator, claim, checks_for("accept"))
        assert signed_post(served.url, "/v1/validation/verdicts", validator, served.audience, body).status_code == 200


def _queries(url: str, **kw) -> int:
    with counted() as statements:
        reply = HTTP.get(url, **kw)
    assert reply.status_code == 200, reply.text
    return len(statements)


def test_receipt_lists_cost_the_same_queries_for_2_or_12_receipts(database_url: str, tmp_path: Path) -> None:
    # The status loop's queries would be counted too: it waits out the test.
    settings = CoordinatorSettings(database_url=database_url, blob_dir=tmp_path / "blobs", status_loop_interval_s=3600)
    with serve(settings) as served:
        _compare(served)


def _compare(coordinator: Served) -> None:
    make_run(
        coordinator,
        sampling=SamplingParams(max_tokens=8),
        prompts=1,
        samples=1,
        audit=AuditPolicy(share=0, new_node_share=0, suspect_share=0),
    )
    token = admin_token(coordinator)
    validator = Account.create()
    grant(coordinator, token, validator.address, "validator")
    node = joined(coordinator)
    admin = {"authorization": f"Bearer {token}"}
    public_url, admin_url = f"{coordinator.url}/v1/public/submissions", f"{coordinator.url}/v1/admin/submissions"

    _judged_submissions(coordinator, node, validator, 2)
    few = (
        _queries(public_url, params={"address": node.address, "limit": 500}),
        _queries(admin_url, params={"limit": 500}, headers=admin),
    )
    _judged_submissions(coordinator, node, validator, 10)
    many = (
        _queries(public_url, params={"address": node.address, "limit": 500}),
        _queries(admin_url, params={"limit": 500}, headers=admin),
    )
    assert many == few and max(many) <= 12, (few, many)


def test_a_flood_of_public_readers_costs_one_computation_per_interval(sqlite_url: str, tmp_path: Path) -> None:
    settings = CoordinatorSettings(
        database_url=sqlite_url,
        blob_dir=tmp_path / "blobs",
        status_loop_interval_s=3600,
        **LIFTED,
        aggregate_reads_per_s=1000,
        aggregate_reads_burst=1000,
    )
    with serve(settings) as served:
        run_id = make_run(served)
        throughput = f"{served.url}/v1/public/runs/{run_id}/throughput"
        for url, params in ((f"{served.url}/v1/public/leaderboard", {}), (throughput, {"minutes": 720, "bucket_s": 60})):
            first = _queries(url, params=params)
            assert first > 0
            with counted() as statements, httpx.Client() as client:
                answers = [client.get(url, params=params) for _ in range(30)]
            assert {a.status_code for a in answers} == {200} and len({a.content for a in answers}) == 1
            # Computed once per 2 s interval: 30 readers (a few intervals on a loaded machine) against 30 computations.
            assert len(statements) < 5 * first, f"{url}: 30 readers ran {len(statements)} statements, one read {first}"
        # A day by the minute would be 1,440 buckets: the answer's size is bounded, the reader told how.
        reply = HTTP.get(throughput, params={"minutes": 1440, "bucket_s": 60})
        assert reply.status_code == 422 and "ask for wider buckets" in reply.json()["message"]
        assert HTTP.get(throughput, params={"minutes": 1440, "bucket_s": 120}).status_code == 200
