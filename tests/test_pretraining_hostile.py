"""Hostile callers of a pretraining run's island routes (issue #47's hostile cases that need no audit): a fresh
wallet calling every route (the audits' too) a thousand times, an island acting for another or reporting what it
does not hold, and malformed requests are each refused with a clear 4xx and change nothing; an island that never
reports loses its shards once its lease runs out, and they go to the next island that claims, lowest first."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from eth_account import Account
from eth_account.signers.local import LocalAccount

from intellect_protocol.coordinator.settings import CoordinatorSettings
from intellect_protocol.shared.coordinator_client import CoordinatorClient, Refused
from intellect_protocol.shared.island_audit_schemas import IslandAuditVerdict
from intellect_protocol.shared.island_schemas import IslandClaim, IslandJoin, IslandReport, IslandSettle
from intellect_protocol.shared.pretraining.manifest import load_manifest
from tests.conftest import LIFTED, admin_token, serve
from tests.helpers import signed_post
from tests.support.clock import MovableClock
from tests.support.protocol import grant
from tests.test_island_shares import publish, refused
from tests.test_pretraining_run import create

pytestmark = pytest.mark.integration
ATTEMPT = "a" * 32


def pretraining_run(database_url: str, tmp_path: Path, example: Path) -> tuple[str, CoordinatorSettings]:
    """A pretraining run of ``example`` in a fresh ledger, and a coordinator's settings for it (island leases of 60 s)."""
    code, out = create(database_url, tmp_path / "blobs", example)
    assert code == 0, out
    settings = CoordinatorSettings(
        database_url=database_url,
        blob_dir=tmp_path / "blobs",
        **LIFTED,
        heartbeat_interval_s=3600,
        island_lease_s=60,
    )
    return out.strip().splitlines()[-1], settings


def test_hostile_calls_change_nothing_and_a_silent_islands_shards_come_back(
    sqlite_url: str,
    tmp_path: Path,
    example: Path,  # noqa: F811
) -> None:
    run_id, settings = pretraining_run(sqlite_url, tmp_path, example)
    manifest = load_manifest(example / "corpus")
    clock = MovableClock()
    with serve(settings, clock=clock) as served:
        token = admin_token(served)
        east, west, stranger = Account.create(), Account.create(), Account.create()
        for key in (east, west):
            grant(served, token, key.address, "trainer")
        a, b, s = (CoordinatorClient(served.url, key) for key in (east, west, stranger))

        def body(schema: Any, key: LocalAccount, island: str, **fields: Any) -> Any:
            return schema(address=key.address, run_id=run_id, island=island, **fields)

        held = a.island_claim_shards(body(IslandClaim, east, "east", limit=4)).slots
        assert [slot.cursor for slot in held] == [1, 2, 3, 4]

        # A fresh wallet, a thousand calls over every island route and the shards: each refused, nothing changes.
        calls = [
            lambda: s.island_claim_shards(body(IslandClaim, stranger, "east", limit=500)),
            lambda: s.island_join(body(IslandJoin, stranger, "east")),
            lambda: s.island_report(body(IslandReport, stranger, "east", outer_step=0, attempt=ATTEMPT, cursors=[1])),
            lambda: s.island_settle(body(IslandSettle, stranger, "east", outer_step=0, included=[])),
            lambda: s.corpus_shard(run_id, manifest.shards[0].sha256),
            lambda: s.upload_pseudo_gradient(run_id, b"\x00" * 64),
            lambda: s.island_audits(),
            lambda: s.island_audit_file(1),
            lambda: s.island_audit_verdict(1, IslandAuditVerdict(address=stranger.address, relative_error=0.0, cosine=1.0)),
        ]
        before = served.snapshot()
        statuses: Counter[int] = Counter()
        for i in range(1000):
            with pytest.raises(Refused) as caught:
                calls[i % len(calls)]()
            statuses[caught.value.status] += 1
        assert statuses == {403: 1000}
        assert served.snapshot() == before

        # One trainer cannot act as another's island, nor report slots it does not hold, nor for a step not next.
        refused(403, lambda: b.island_claim_shards(body(IslandClaim, west, "east")), served)
        refused(
            409, lambda: b.island_report(body(IslandReport, west, "west", outer_step=0, attempt=ATTEMPT, cursors=[1])), served
        )
        refused(
            409, lambda: a.island_report(body(IslandReport, east, "east", outer_step=5, attempt=ATTEMPT, cursors=[1])), served
        )
        # A lie in each field the caller declares: another's address (the signature says who sent it), a run that is
        # not there.
        before = served.snapshot()
        lied = signed_post(
            served.url,
            "/v1/trainer/islands/claim-shards",
            west,
            served.audience,
            {"address": east.address, "run_id": run_id, "island": "west"},
        )
        assert lied.status_code in (401, 403) and served.snapshot() == before, lied.text
        refused(404, lambda: b.island_claim_shards(IslandClaim(address=west.address, run_id="run-none", island="west")), served)
        # Malformed requests: 422, nothing changes.
        before = served.snapshot()
        claim = {"address": east.address, "run_id": run_id, "island": "east"}
        for bad in ({"limit": 0}, {"limit": 501}, {"island": "../east"}, {"wait_s": 60}, {"surprise": 1}):
            reply = signed_post(served.url, "/v1/trainer/islands/claim-shards", east, served.audience, {**claim, **bad})
            assert reply.status_code == 422, (bad, reply.text)
        with pytest.raises(Refused) as caught:
            a.corpus_shard(run_id, "../" + "0" * 61)
        assert caught.value.status in (404, 422)
        verdict = {"address": east.address, "relative_error": 0.0, "cosine": 1.0}
        for path, bad in (("1", {"relative_error": -1}), ("1", {"cosine": 2}), ("1", {"surprise": 1}), ("0", {}), ("x", {})):
            reply = signed_post(
                served.url, f"/v1/validation/island-audits/{path}/verdict", east, served.audience, {**verdict, **bad}
            )
            assert reply.status_code == 422, (path, bad, reply.text)
        assert served.snapshot() == before

        # East goes silent: past its lease its slots go back, lowest first, to the next island that claims.
        clock.advance(61)
        again = b.island_claim_shards(body(IslandClaim, west, "west", limit=4))
        assert [slot.cursor for slot in again.slots] == [1, 2, 3, 4]
        # East, back, cannot report what it no longer holds: its outer step must go without those shards.
        refused(
            409, lambda: a.island_report(body(IslandReport, east, "east", outer_step=0, attempt=ATTEMPT, cursors=[1, 2])), served
        )
        # West reports them; a repeat of the same report (its answer lost) changes no share (only when it was seen).
        report = body(IslandReport, west, "west", outer_step=0, attempt=ATTEMPT, cursors=[1, 2, 3, 4])
        b.island_report(report)
        shares = served.snapshot()["island_shares"]
        assert sorted((row[1], row[2], row[3]) for row in shares) == [(c, "west", "pending") for c in (1, 2, 3, 4)]
        b.island_report(report)
        assert served.snapshot()["island_shares"] == shares


def test_an_audited_runs_step_is_settled_only_with_every_included_pseudo_gradients_sha256(
    sqlite_url: str,
    tmp_path: Path,
    example: Path,  # noqa: F811
) -> None:
    # Islands of several FSDP ranks record no sha256 (their pseudo-gradient is in pieces): in a run that audits, a step
    # they settle would be one no audit could ever be drawn for.
    run_id, settings = pretraining_run(sqlite_url, tmp_path, example)
    with serve(settings) as served:
        east = Account.create()
        grant(served, admin_token(served), east.address, "trainer")
        a = CoordinatorClient(served.url, east)
        a.island_join(IslandJoin(address=east.address, run_id=run_id, island="east"))
        held = a.island_claim_shards(IslandClaim(address=east.address, run_id=run_id, island="east", limit=2)).slots
        cursors = [slot.cursor for slot in held]
        a.island_report(
            IslandReport(address=east.address, run_id=run_id, island="east", outer_step=0, attempt=ATTEMPT, cursors=cursors)
        )
        blind = IslandSettle(
            address=east.address, run_id=run_id, island="east", outer_step=0, included=[{"island": "east", "attempt": ATTEMPT}]
        )
        publish(tmp_path / "origin", run_id, 1, a, ((a, "east"),), blind)
        reason = refused(409, lambda: a.island_settle(blind), served)
        assert "names no sha256 for the pseudo-gradient of east" in reason
        shares = served.snapshot()["island_shares"]
        assert sorted((row[1], row[3]) for row in shares) == [(c, "pending") for c in cursors]  # nothing consumed
