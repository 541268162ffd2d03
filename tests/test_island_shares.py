"""Trainer islands' shares of accepted work, through a real coordinator: each accepted submission goes to
exactly one island, is consumed only when a published step averaged it, comes back when its island
restarts, goes silent or is left out, and no hostile or stale call changes anything."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest
from eth_account import Account
from eth_account.signers.local import LocalAccount
from rich.console import Console

from intellect_protocol.coordinator.settings import CoordinatorSettings
from intellect_protocol.node.work import finish, generate
from intellect_protocol.shared.coordinator_client import CoordinatorClient, Refused
from intellect_protocol.shared.island_schemas import (
    IslandClaim,
    IslandHealCheck,
    IslandJoin,
    IslandReport,
    IslandSettle,
    IslandVouch,
    step_record,
)
from intellect_protocol.shared.run_schemas import AuditPolicy
from intellect_protocol.shared.schemas import SamplingParams
from intellect_protocol.shared.shardcast.manifest import SignedManifest
from intellect_protocol.shared.shardcast.origin import publish_step, step_dir
from intellect_protocol.validator.worker import Validator
from tests.conftest import LIFTED, ON_POSTGRES_ONLY, admin_token, serve
from tests.helpers import hung_up, make_run, signed_post
from tests.support.clock import MovableClock
from tests.support.protocol import grant, joined, lease, upload

pytestmark = pytest.mark.integration
NO_AUDIT = AuditPolicy(share=0, new_node_share=0, suspect_share=0)


def refused(status: int, call, served) -> str:
    """Assert ``call`` is refused with ``status`` and that the ledger is as it was; returns the message."""
    before = served.snapshot()
    with pytest.raises(Refused) as caught:
        call()
    assert caught.value.status == status, caught.value
    assert served.snapshot() == before
    return caught.value.message


def islands_settings(database_url: str, tmp_path: Path) -> CoordinatorSettings:
    """Island leases of 60 s (tests move the clock past them). Nodes never heartbeat: on a busy machine a test
    outlasts the default 20 s before the health sweep would mark one unhealthy in a "nothing changed" comparison."""
    return CoordinatorSettings(
        database_url=database_url,
        blob_dir=tmp_path / "blobs",
        **LIFTED,
        island_lease_s=60,
        heartbeat_interval_s=3600,
    )


def build(origin: Path, run_id: str, step: int, client: CoordinatorClient, weights: bytes | None = None) -> SignedManifest:
    """Policy step ``step``'s files and manifest, signed by ``client`` (the files' content does not matter here)."""
    directory = step_dir(origin, run_id, step)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text("{}")
    (directory / "model.safetensors").write_bytes(weights or f"weights {step}".encode())
    return publish_step(origin, run_id, step, client.account)


NOBODY_LEFT_OUT = step_record([], {})


def vouch(
    client: CoordinatorClient, run_id: str, island: str, signed: SignedManifest, publisher: str, record: str = NOBODY_LEFT_OUT
) -> None:
    body = IslandVouch(
        address=client.account.address,
        run_id=run_id,
        island=island,
        step=signed.manifest.step,
        content=signed.manifest.content_digest(),
        publisher=publisher,
        record=record,
    )
    client.island_vouch(body)


def publish(
    origin: Path,
    run_id: str,
    step: int,
    client: CoordinatorClient,
    vouchers: tuple[tuple[CoordinatorClient, str], ...] = (),
    settle: IslandSettle | None = None,
) -> None:
    """Policy step ``step`` registered by ``client``, the first of ``vouchers`` (client, island) that vouch for it
    and for ``settle``'s record of it."""
    signed = build(origin, run_id, step, client)
    record = step_record(settle.included, settle.excluded) if settle else NOBODY_LEFT_OUT
    for voucher, island in vouchers:
        vouch(voucher, run_id, island, signed, vouchers[0][1], record)
    client.publish_manifest(signed)


@ON_POSTGRES_ONLY
def test_each_accepted_submission_goes_to_one_island_once(database_url: str, tmp_path: Path) -> None:
    clock = MovableClock()
    with serve(islands_settings(database_url, tmp_path), clock=clock) as served:
        run_id = make_run(served, sampling=SamplingParams(max_tokens=8), audit=NO_AUDIT)
        token = admin_token(served)
        a_key, b_key, impostor, validator_key = (Account.create() for _ in range(4))
        for key in (a_key, b_key, impostor):
            grant(served, token, key.address, "trainer")
        grant(served, token, validator_key.address, "validator")
        node = joined(served)
        for _ in range(6):
            task = lease(served, node)
            upload(served, node, task, finish(generate(task)).data)
        validator = Validator(served.url, validator_key, tmp_path / "validator", Console(quiet=True))
        validator.run(max_submissions=6)
        validator.close()
        a, b, other, stranger = (CoordinatorClient(served.url, k) for k in (a_key, b_key, impostor, Account.create()))

        def body(schema, key: LocalAccount, island: str, **fields):
            return schema(address=key.address, run_id=run_id, island=island, **fields)

        assert a.island_join(body(IslandJoin, a_key, "a")) == 0
        mine = a.island_claim(body(IslandClaim, a_key, "a", limit=3))
        theirs = b.island_claim(body(IslandClaim, b_key, "b", limit=100))
        assert len(mine) == 3 and len(theirs) == 3  # b asked for all: its fair share is half, a being live
        assert not {e.cursor for e in mine} & {e.cursor for e in theirs}
        # A claim whose answer was lost is not lost: the island gets what it holds again, and nothing new is left.
        assert [e.cursor for e in a.island_claim(body(IslandClaim, a_key, "a", limit=5))] == [e.cursor for e in mine]

        # Another trainer cannot act as island a; an address without the trainer role cannot claim at all.
        refused(403, lambda: other.island_claim(body(IslandClaim, impostor, "a")), served)
        refused(403, lambda: stranger.island_claim(body(IslandClaim, stranger.account, "c")), served)

        attempt = uuid.uuid4().hex
        report = body(IslandReport, a_key, "a", outer_step=0, attempt=attempt, cursors=[e.cursor for e in mine])
        # A report naming a submission island a does not hold changes nothing: it must stay out of the step.
        stolen = report.model_copy(update={"cursors": [mine[0].cursor, theirs[0].cursor]})
        assert "1 of these 2" in refused(409, lambda: a.island_report(stolen), served)
        # A lie about the outer step would leave the shares waiting for a settling that never comes.
        for lie in (2, 10**6):
            assert "not the run's next" in refused(
                409, lambda lie=lie: a.island_report(report.model_copy(update={"outer_step": lie})), served
            )
        a.island_report(report)
        a.island_report(report)  # a repeat (an answer lost) is the same report
        refused(409, lambda: a.island_report(report.model_copy(update={"attempt": uuid.uuid4().hex})), served)

        settle = body(IslandSettle, a_key, "a", outer_step=0, included=[{"island": "a", "attempt": attempt}])
        assert "not published" in refused(409, lambda: a.island_settle(settle), served)
        # A run moves one step at a time, and an island run only by its islands' trainers: a trainer-role holder
        # that never joined as an island publishes nothing, and no island jumps the run ahead.
        assert "only step 1 may be published next, not 1000" in refused(
            409, lambda: publish(tmp_path / "origin", run_id, 1000, a), served
        )
        assert "trained by islands" in refused(403, lambda: publish(tmp_path / "impostor", run_id, 1, other), served)
        publish(tmp_path / "origin", run_id, 1, a, ((a, "a"), (b, "b")), settle)
        # Only the island that published the step settles it: b cannot consume or release what a reported.
        forged = body(IslandSettle, b_key, "b", outer_step=0, included=[])
        assert "published policy step 1" in refused(403, lambda: b.island_settle(forged), served)
        assert a.island_settle(settle).consumed == 3
        assert a.island_settle(settle).consumed == 0  # settling again changes nothing

        # b goes silent past its lease: what it claimed goes to a, and b's late report is refused.
        clock.advance(61)
        taken = a.island_claim(body(IslandClaim, a_key, "a", limit=100))
        assert sorted(e.cursor for e in taken) == sorted(e.cursor for e in theirs)
        late = body(IslandReport, b_key, "b", outer_step=1, attempt=uuid.uuid4().hex, cursors=[e.cursor for e in theirs])
        refused(409, lambda: b.island_report(late), served)

        # a restarts: what it held unreported goes back, and b gets it. Consumed work never comes back.
        assert a.island_join(body(IslandJoin, a_key, "a")) == 3
        again = b.island_claim(body(IslandClaim, b_key, "b", limit=100))
        assert sorted(e.cursor for e in again) == sorted(e.cursor for e in theirs)[:2]  # a is live again: half

        # An island left out of a published step (excluded, or its attempt failed) gets nothing consumed.
        left_out = uuid.uuid4().hex
        b.island_report(body(IslandReport, b_key, "b", outer_step=1, attempt=left_out, cursors=[e.cursor for e in again]))
        settle_1 = body(IslandSettle, a_key, "a", outer_step=1, included=[], excluded={"b": "its pseudo-gradient is not finite"})
        publish(tmp_path / "origin", run_id, 2, a, ((a, "a"), (b, "b")), settle_1)
        assert a.island_settle(settle_1).consumed == 0
        assert a.island_settle(settle_1).consumed == 0  # settled again (a later publisher may): counted once
        status = {i.name: i for i in a.islands(run_id)}
        assert (status["a"].consumed, status["b"].consumed, status["b"].pending) == (3, 0, 0)
        assert status["b"].excluded_steps == 1 and "not finite" in (status["b"].last_exclusion or "")
        assert len(b.island_claim(body(IslandClaim, b_key, "b", limit=100))) == 2  # back in the pool, and b's again

        # 250 fresh wallets, each calling every island route (1,500 calls) with a body naming itself: all refused
        # (no trainer role), and the ledger does not change.
        before = served.snapshot()
        for _ in range(250):
            fresh = Account.create()
            for path, payload in (
                ("join", body(IslandJoin, fresh, "a")),
                ("claim", body(IslandClaim, fresh, "a")),
                ("report", body(IslandReport, fresh, "a", outer_step=2, attempt=attempt, cursors=[mine[0].cursor])),
                ("settle", body(IslandSettle, fresh, "a", outer_step=0, included=[])),
                ("vouch", body(IslandVouch, fresh, "a", step=3, content="0" * 64, publisher="a", record=NOBODY_LEFT_OUT)),
                ("heal-check", body(IslandHealCheck, fresh, "a", step=2, content="0" * 64)),
            ):
                reply = signed_post(
                    served.url, f"/v1/trainer/islands/{path}", fresh, served.audience, payload.model_dump(mode="json")
                )
                assert reply.status_code in (403, 429), reply.text
        # A body naming an address other than the signer's is refused before anything is read.
        reply = signed_post(
            served.url, "/v1/trainer/islands/claim", a_key, served.audience, body(IslandClaim, b_key, "b").model_dump(mode="json")
        )
        assert reply.status_code == 401
        assert served.snapshot() == before

        # Malformed: an island name that is not a name, or a report beyond the cap, is refused before the ledger.
        with pytest.raises(ValueError):
            body(IslandJoin, a_key, "../a")
        before = served.snapshot()
        oversized = {**report.model_dump(), "cursors": list(range(1, 10_002))}
        assert signed_post(served.url, "/v1/trainer/islands/report", a_key, served.audience, oversized).status_code == 422
        assert served.snapshot() == before
        for client in (a, b, other, stranger):
            client.close()


def test_a_trainer_that_keeps_claiming_holds_no_more_than_its_share(database_url: str, tmp_path: Path) -> None:
    """Round four: one island claiming again and again held the whole pool, and the honest one got 0 shares in
    29 claims; the cap was per island name, so a second name doubled it. Shares are now an equal part of the
    pool per live trainer address, whatever the names and however often it asks."""
    settings = CoordinatorSettings(
        database_url=database_url,
        blob_dir=tmp_path / "blobs",
        **LIFTED,
        heartbeat_interval_s=3600,
    )
    with serve(settings) as served:
        run_id = make_run(served, sampling=SamplingParams(max_tokens=8), audit=NO_AUDIT)
        token = admin_token(served)
        hoarder_key, honest_key, validator_key = (Account.create() for _ in range(3))
        for key in (hoarder_key, honest_key):
            grant(served, token, key.address, "trainer")
        grant(served, token, validator_key.address, "validator")
        node = joined(served)

        def accept(n: int) -> None:
            for _ in range(n):
                task = lease(served, node)
                upload(served, node, task, finish(generate(task)).data)
            validator = Validator(served.url, validator_key, tmp_path / "validator", Console(quiet=True))
            validator.run(max_submissions=n)
            validator.close()

        accept(6)
        hoarder, honest = CoordinatorClient(served.url, hoarder_key), CoordinatorClient(served.url, honest_key)

        def claim(client: CoordinatorClient, island: str) -> set[int]:
            body = IslandClaim(address=client.account.address, run_id=run_id, island=island, limit=100)
            return {e.cursor for e in client.island_claim(body)}

        honest.island_join(IslandJoin(address=honest_key.address, run_id=run_id, island="honest"))
        hoard = set()
        for _ in range(10):
            hoard |= claim(hoarder, "h-1") | claim(hoarder, "h-2")
        assert len(hoard) == 3  # two live addresses, six accepted: three each, over both of the hoarder's names
        fair = claim(honest, "honest")
        assert len(fair) == 3 and not fair & hoard
        # New work is shared the same way: the hoarder asks first and for everything, and gets its half of ten.
        accept(4)
        for _ in range(5):
            hoard |= claim(hoarder, "h-1") | claim(hoarder, "h-2")
        assert len(hoard) == 5
        assert len(claim(honest, "honest")) == 5
        for client in (hoarder, honest):
            client.close()


def test_an_island_that_hangs_up_mid_wait_holds_nothing_accepted_after(sqlite_url: str, tmp_path: Path) -> None:
    """A stopped island's long poll must not claim the next accepted submission: it would be held unreported,
    away from every other island, until the island's lease ran out."""
    with serve(islands_settings(sqlite_url, tmp_path)) as served:
        run_id = make_run(served, sampling=SamplingParams(max_tokens=8), audit=NO_AUDIT)
        token = admin_token(served)
        trainer_key, validator_key = Account.create(), Account.create()
        grant(served, token, trainer_key.address, "trainer")
        grant(served, token, validator_key.address, "validator")
        island = CoordinatorClient(served.url, trainer_key)
        island.island_join(IslandJoin(address=trainer_key.address, run_id=run_id, island="a"))
        claim = IslandClaim(address=trainer_key.address, run_id=run_id, island="a", wait_s=10)
        with hung_up(served.url, "/v1/trainer/islands/claim", trainer_key, served.audience, claim.model_dump(mode="json")):
            time.sleep(0.5)  # its first look found nothing: it waits
        node = joined(served)
        task = lease(served, node)
        upload(served, node, task, finish(generate(task)).data)
        validator = Validator(served.url, validator_key, tmp_path / "validator", Console(quiet=True))
        validator.run(max_submissions=1)
        validator.close()
        time.sleep(1.0)  # what a long poll still waiting would claim at once, on the verdict's wake-up
        assert {i.name: i.claimed for i in island.islands(run_id)} == {"a": 0}
        assert len(island.island_claim(claim.model_copy(update={"wait_s": 0}))) == 1
        island.close()


def test_a_step_is_published_only_as_most_live_islands_vouch_for_its_content_and_publisher(
    database_url: str, tmp_path: Path
) -> None:
    """Round four: any trainer island published any weights (step 1000 of random bytes). The run still moves one
    step at a time, and now a step's manifest is accepted only with the content most live islands built from the
    agreed weights, from the island they chose: one liar of three can neither publish its own bytes nor publish
    as another, and nothing it sends changes the ledger."""
    clock = MovableClock()
    with serve(islands_settings(database_url, tmp_path), clock=clock) as served:
        run_id = make_run(served, sampling=SamplingParams(max_tokens=8), audit=NO_AUDIT)
        token = admin_token(served)
        keys = {name: Account.create() for name in ("a", "b", "liar")}
        for key in keys.values():
            grant(served, token, key.address, "trainer")
        clients = {name: CoordinatorClient(served.url, key) for name, key in keys.items()}
        a, b, liar = clients["a"], clients["b"], clients["liar"]
        for name, client in clients.items():
            client.island_join(IslandJoin(address=client.account.address, run_id=run_id, island=name))
        origin = {name: tmp_path / name for name in clients}

        # Step 1, chosen publisher a: a's own word is one of three live islands'; with b's it is most.
        step_1 = build(origin["a"], run_id, 1, a)
        vouch(a, run_id, "a", step_1, "a")
        assert "1 of the 2 trainer addresses needed (3 live)" in refused(409, lambda: a.publish_manifest(step_1), served)
        vouch(b, run_id, "b", step_1, "a")
        a.publish_manifest(step_1)
        assert a.run_info(run_id).policy_step == 1

        # Step 2, chosen publisher b. The liar vouches for its own bytes as publisher, and cannot publish them, nor
        # the honest content under its own name, nor change its word, nor speak for another island.
        honest = build(origin["b"], run_id, 2, b)
        forged = build(origin["liar"], run_id, 2, liar, weights=b"random bytes")
        vouch(liar, run_id, "liar", forged, "liar")
        refused(409, lambda: liar.publish_manifest(forged), served)
        vouch(a, run_id, "a", honest, "b")
        vouch(b, run_id, "b", honest, "b")
        as_liar = build(tmp_path / "liar-copy", run_id, 2, liar)  # the same files, signed by the liar
        assert as_liar.manifest.content_digest() == honest.manifest.content_digest()
        refused(409, lambda: liar.publish_manifest(as_liar), served)
        assert "vouched otherwise" in refused(409, lambda: vouch(liar, run_id, "liar", honest, "b"), served)
        refused(403, lambda: vouch(liar, run_id, "a", forged, "liar"), served)
        refused(403, lambda: vouch(CoordinatorClient(served.url, Account.create()), run_id, "c", forged, "c"), served)
        b.publish_manifest(honest)
        assert a.run_info(run_id).policy_step == 2
        # b settles step 2 only with the record a and b vouched for: not by releasing or excluding on its own word.
        settle = IslandSettle(address=keys["b"].address, run_id=run_id, island="b", outer_step=1, included=[])
        lied = settle.model_copy(update={"excluded": {"a": "its pseudo-gradient is not finite"}})
        assert "0 of the 3 trainer addresses that vouched" in refused(409, lambda: b.island_settle(lied), served)
        assert b.island_settle(settle).consumed == 0
        # Vouching for a published step, or beyond the next two, changes nothing.
        for step in (2, 5):
            late = build(origin["a"], run_id, step, a)
            assert "not one of the next" in refused(409, lambda late=late: vouch(a, run_id, "a", late, "a"), served)

        # The others silent past the lease: a is the run's only live island, and its own word is enough.
        clock.advance(61)
        step_3 = build(origin["a"], run_id, 3, a)
        vouch(a, run_id, "a", step_3, "a")
        a.publish_manifest(step_3)
        assert a.run_info(run_id).policy_step == 3

        # An island recovering from a peer keeps what it received only if the coordinator holds that content for
        # the step: published, or vouched for by most of the other live islands. The liar's word alone is not that.
        def heal_check(island: str, step: int, content: str) -> None:
            client = clients[island]
            client.island_heal_check(
                IslandHealCheck(address=client.account.address, run_id=run_id, island=island, step=step, content=content)
            )

        heal_check("a", 3, step_3.manifest.content_digest())
        assert "published with other content" in refused(
            409, lambda: heal_check("a", 3, forged.manifest.content_digest()), served
        )
        honest_4, forged_4 = build(origin["b"], run_id, 4, b), build(origin["liar"], run_id, 4, liar, weights=b"poison")
        vouch(b, run_id, "b", honest_4, "b")
        vouch(liar, run_id, "liar", forged_4, "liar")
        for signed in (honest_4, forged_4):
            content = signed.manifest.content_digest()
            assert "1 of the other 2 live" in refused(409, lambda content=content: heal_check("a", 4, content), served)
        clock.advance(61)  # the liar silent past the lease; b still there: with two islands, the peer's word is enough
        vouch(b, run_id, "b", honest_4, "b")
        heal_check("a", 4, honest_4.manifest.content_digest())
        assert "0 of the other 1 live" in refused(409, lambda: heal_check("a", 4, forged_4.manifest.content_digest()), served)
        stranger = CoordinatorClient(served.url, Account.create())
        body = IslandHealCheck(address=stranger.account.address, run_id=run_id, island="x", step=4, content="0" * 64)
        refused(403, lambda: stranger.island_heal_check(body), served)
        for client in (*clients.values(), stranger):
            client.close()
