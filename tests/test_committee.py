"""No validator is trusted alone, through the real API: random assignment, audits before training,
second opinions, appeals, and validators held to account.

Honest validators here are the real :class:`Validator` (real checks on real files) where the
verdict matters; a rogue validator is an address posting verdicts by hand, signed as any validator
must. Statistical tests use hand-posted verdicts on both sides, so they can be many.
"""

from __future__ import annotations

import math
import os
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

from eth_account import Account
from eth_account.signers.local import LocalAccount
from rich.console import Console
from sqlalchemy import select

from intellect_protocol.coordinator.db import make_sessionmaker
from intellect_protocol.coordinator.models import Node, NodeStrike, Review, ValidatorStrike
from intellect_protocol.coordinator.settings import CoordinatorSettings
from intellect_protocol.node.work import finish, generate
from intellect_protocol.shared.committee import PublicReceipt
from intellect_protocol.shared.run_schemas import AuditPolicy
from intellect_protocol.shared.schemas import SamplingParams
from intellect_protocol.shared.verdicts import verdict_signer
from intellect_protocol.validator.worker import Validator
from tests.conftest import LIFTED, ON_POSTGRES_ONLY, Served, admin_token, serve
from tests.helpers import HTTP, checks_for, make_run, signed_post, verdict_body
from tests.support.protocol import check_ledger, claim_all, forge, grant, joined, lease, upload

NO_AUDIT = AuditPolicy(share=0, new_node_share=0, suspect_share=0)


def judge_all(served: Served, validator: LocalAccount, say: Callable[[dict], str]) -> list[str]:
    """Claim what was drawn for ``validator`` and post ``say(claim)`` for each; the judged ids."""
    judged = []
    for c in claim_all(served, validator):
        reply = signed_post(
            served.url,
            "/v1/validation/verdicts",
            validator,
            served.audience,
            verdict_body(served.audience, validator, c, checks_for(say(c))),
        )
        assert reply.status_code == 200, reply.text
        judged.append(c["submission_id"])
    return judged


def receipt(served: Served, submission_id: str) -> PublicReceipt:
    return PublicReceipt.model_validate(HTTP.get(f"{served.url}/v1/public/submissions/{submission_id}").json())


def trainer_reads(served: Served, trainer: LocalAccount, run_id: str, after: int = 0, limit: int = 500) -> set[str]:
    return {r["submission_id"] for r in trainer_page(served, trainer, run_id, after, limit)}


def trainer_page(served: Served, trainer: LocalAccount, run_id: str, after: int = 0, limit: int = 500) -> list[dict]:
    """What the trainer reads after its cursor ``after`` (reading from ``after`` says all up to it was used)."""
    from intellect_protocol.shared.signing import sign_request

    path, query = "/v1/trainer/rollouts", f"after={after}&limit={limit}&run={run_id}"
    reply = HTTP.get(f"{served.url}{path}?{query}", headers=sign_request(trainer, "GET", path, query, b"", served.audience))
    assert reply.status_code == 200, reply.text
    return reply.json()


def validate_until(served: Served, validators: list[Validator], done: Callable[[], bool], timeout: float = 300) -> None:
    """Run real validators side by side until ``done()``."""
    threads = [threading.Thread(target=v.run, daemon=True) for v in validators]
    for t in threads:
        t.start()
    try:
        deadline = time.monotonic() + timeout
        while not done():
            assert time.monotonic() < deadline, "validators did not finish"
            assert all(t.is_alive() for t in threads), "a validator died"
            time.sleep(0.2)
    finally:
        for v in validators:
            v.stop.set()
        for t in threads:
            t.join(60)
        for v in validators:
            v.close()


def strikes_of(served: Served, address: str) -> int:
    with make_sessionmaker(served.engine)() as session:
        return session.get_one(Node, address).strikes


def undecided(served: Served, ids: set[str]) -> set[str]:
    receipts = [receipt(served, i) for i in ids]
    return {r.submission_id for r in receipts if r.status == "pending" or (r.appeal is not None and r.appeal.status == "open")}


@ON_POSTGRES_ONLY
def test_a_rogue_validators_approvals_of_forged_work_never_reach_the_trainer_when_all_its_verdicts_are_audited(
    database_url: str, tmp_path: Path
) -> None:
    settings = CoordinatorSettings(
        database_url=database_url,
        blob_dir=tmp_path / "blobs",
        **LIFTED,
        validator_max_strikes=3,
    )
    with serve(settings) as served:
        run_id = make_run(served, sampling=SamplingParams(max_tokens=32), prompts=1, samples=2, audit=AuditPolicy(share=1.0))
        token = admin_token(served)
        rogue, first, second, trainer = (Account.create() for _ in range(4))
        for v in (rogue, first, second):
            grant(served, token, v.address, "validator")
        grant(served, token, trainer.address, "trainer")
        cheat, honest = joined(served), joined(served)
        claim_all(served, rogue)  # only the rogue is live: it is drawn for every first look
        forged = {upload(served, cheat, t, forge(t)) for t in (lease(served, cheat) for _ in range(3))}
        fine = {upload(served, honest, t, finish(generate(t)).data) for t in (lease(served, honest) for _ in range(2))}
        assert set(judge_all(served, rogue, lambda c: "accept")) == forged | fine
        assert trainer_reads(served, trainer, run_id) == set()  # approved, but not yet audited
        assert all(receipt(served, i).status == "pending" for i in forged | fine)

        honest_validators = [
            Validator(served.url, v, tmp_path / v.address, Console(quiet=True), batch=2) for v in (first, second)
        ]
        # Forged first: the rogue's revocation comes with the last forged rejection and takes the honest
        # files it approved back to pending, so reading those first could find them decided just before.
        validate_until(served, honest_validators, lambda: not undecided(served, forged) and not undecided(served, fine))

        for i in forged:
            r = receipt(served, i)
            assert r.status == "rejected" and r.hard, r.reason
            assert [v.validator for v in r.verdicts if v.agreed is False] == [rogue.address]
            for v in r.verdicts:  # anyone can check each verdict's signature
                assert verdict_signer(v.signature, served.audience, i, r.sha256, v.checks, v.untrained_rows) == v.validator
        outcomes = {i: receipt(served, i) for i in fine}
        assert {i: r.status for i, r in outcomes.items()} == dict.fromkeys(fine, "accepted"), outcomes
        assert trainer_reads(served, trainer, run_id) == fine
        standings = {s["address"]: s for s in HTTP.get(f"{served.url}/v1/public/validators").json()}
        assert not standings[rogue.address]["active"] and "outvoted" in standings[rogue.address]["revoke_reason"]
        assert standings[rogue.address]["agreement_rate"] < 0.5 < standings[first.address]["agreement_rate"]
        refused = signed_post(served.url, "/v1/validation/claim", rogue, served.audience, {"address": rogue.address, "limit": 1})
        assert refused.status_code == 403 and "outvoted" in refused.json()["message"]
        with make_sessionmaker(served.engine)() as session:
            # Never credited, the cheat is banned on its first forged file (3 strikes), then struck once a file.
            assert session.get_one(Node, cheat.address).strikes == 5 and session.get_one(Node, honest.address).strikes == 0
        check_ledger(served)


@ON_POSTGRES_ONLY
def test_unaudited_approvals_are_caught_at_the_configured_rate(database_url: str, tmp_path: Path) -> None:
    share, n = 0.3, 120
    settings = CoordinatorSettings(
        database_url=database_url,
        blob_dir=tmp_path / "blobs",
        rate_limit_per_s=5000,
        newcomer_uploads_per_s=5000,
        rate_limit_burst=5000,
        validator_max_strikes=10_000,
        max_strikes=10_000,
        max_validation_backlog=1000,
        backlog_floor=1000,
        max_leases_per_node=8,
    )
    with serve(settings) as served:
        policy = AuditPolicy(share=share, new_node_share=share, suspect_share=share)
        run_id = make_run(served, sampling=SamplingParams(max_tokens=4), prompts=1, samples=1, audit=policy)
        token = admin_token(served)
        rogue, first, second, trainer = (Account.create() for _ in range(4))
        for v in (rogue, first, second):
            grant(served, token, v.address, "validator")
        grant(served, token, trainer.address, "trainer")
        cheat = joined(served)
        claim_all(served, rogue)
        ids = set()
        for _ in range(n):
            ids.add(
                upload(served, cheat, (t := lease(served, cheat)), finish(generate(t)).data)
            )  # "forged": the rogue approves anything
        approved: list[str] = []
        while batch := judge_all(served, rogue, lambda c: "accept"):
            approved += batch
        assert sorted(approved) == sorted(ids)
        # The trainer reads (and so uses) what is accepted now, before any audit comes back: nothing
        # is left to withhold when the rogue is caught, so only the configured share is audited.
        read = trainer_page(served, trainer, run_id)
        trainer_page(served, trainer, run_id, after=read[-1]["cursor"])
        while judge_all(served, first, lambda c: "hard") + judge_all(served, second, lambda c: "hard"):
            pass
        audited = [i for i in ids if any(v.purpose == "audit" for v in receipt(served, i).verdicts)]
        sigma = math.sqrt(n * share * (1 - share))
        assert abs(len(audited) - n * share) < 4.5 * sigma, (len(audited), n * share)
        assert all(receipt(served, i).status == "rejected" for i in audited)
        assert trainer_reads(served, trainer, run_id) == ids - set(audited)  # the rest got through: that is what a share means
        with make_sessionmaker(served.engine)() as session:
            assert len(session.scalars(select(ValidatorStrike).where(ValidatorStrike.validator == rogue.address)).all()) == len(
                audited
            )


def test_a_rogue_rejection_is_overturned_on_appeal_and_the_outvoted_lose_their_role(sqlite_url: str, tmp_path: Path) -> None:
    from intellect_protocol.shared.wallet import THROWAWAY_SCRYPT_N, create_wallet, load_wallet

    settings = CoordinatorSettings(
        database_url=sqlite_url,
        blob_dir=tmp_path / "blobs",
        **LIFTED,
        validator_max_strikes=1,
        appeals_per_day=2,
        dispute_window_s=3600,
    )
    with serve(settings) as served:
        make_run(served, sampling=SamplingParams(max_tokens=32), prompts=1, samples=2, audit=NO_AUDIT)
        token = admin_token(served)
        rogues = [Account.create(), Account.create()]  # colluding: one looks first, the other gives the second opinion
        for v in rogues:
            grant(served, token, v.address, "validator")
            claim_all(served, v)
        wallet = tmp_path / "node.json"
        create_wallet(wallet, "pw", scrypt_n=THROWAWAY_SCRYPT_N)
        node = load_wallet(wallet, "pw")
        assert (
            signed_post(
                served.url,
                "/v1/nodes/register",
                node,
                served.audience,
                {
                    "address": node.address,
                    "specs": {"cpu_cores": 2, "ram_bytes": 1 << 33, "disk_free_bytes": 1 << 36},
                    "client_version": "0.1.0",
                },
            ).status_code
            == 200
        )
        earlier = upload(served, node, (t := lease(served, node)), finish(generate(t)).data)
        while judge_all(served, rogues[0], lambda c: "accept") + judge_all(served, rogues[1], lambda c: "accept"):
            pass
        earned = receipt(served, earlier).credit
        assert receipt(served, earlier).status == "accepted" and earned > 0
        work = upload(served, node, (t := lease(served, node)), finish(generate(t)).data)
        while judge_all(served, rogues[0], lambda c: "hard") + judge_all(served, rogues[1], lambda c: "hard"):
            pass
        rejected = receipt(served, work)
        assert (
            rejected.status == "rejected"
            and rejected.hard
            and [v.purpose for v in rejected.verdicts] == ["first", "second_opinion"]
        )
        assert receipt(served, earlier).credit == 0  # the hard rejection clawed back pending credit
        with make_sessionmaker(served.engine)() as session:
            assert session.get_one(Node, node.address).strikes == 1

        # Refused appeals change nothing.
        stranger = joined(served)
        before = served.snapshot()
        for who, sid in ((stranger, work), (node, earlier), (node, "sub-none")):
            reply = signed_post(served.url, "/v1/appeals", who, served.audience, {"address": who.address, "submission_id": sid})
            assert reply.status_code in (403, 404, 409), reply.text
        assert {k: v for k, v in served.snapshot().items() if k != "nonces"} == {k: v for k, v in before.items() if k != "nonces"}

        # Only the two that judged it hold the role: nobody could hear an appeal, so it is refused at once.
        unheard = signed_post(served.url, "/v1/appeals", node, served.audience, {"address": node.address, "submission_id": work})
        assert unheard.status_code == 409 and "nobody could hear" in unheard.json()["message"]
        assert {k: v for k, v in served.snapshot().items() if k != "nonces"} == {k: v for k, v in before.items() if k != "nonces"}
        fresh = [Account.create(), Account.create()]
        for v in fresh:
            grant(served, token, v.address, "validator")

        shown = subprocess.run(
            [
                "intellect-node",
                "appeal",
                work,
                "--wallet",
                str(wallet),
                "--coordinator",
                served.url,
                "--reason",
                "my work is honest",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "INTELLECT_WALLET_PASSWORD": "pw"},
        )
        assert shown.returncode == 0 and "Appeal" in shown.stdout, shown.stdout + shown.stderr
        again = signed_post(served.url, "/v1/appeals", node, served.audience, {"address": node.address, "submission_id": work})
        assert again.status_code == 409
        assert (
            judge_all(served, rogues[0], lambda c: "hard") == [] == judge_all(served, rogues[1], lambda c: "hard")
        )  # never theirs to hear

        validators = [Validator(served.url, v, tmp_path / v.address, Console(quiet=True)) for v in fresh]
        validate_until(
            served, validators, lambda: receipt(served, work).appeal.status != "open" and not undecided(served, {earlier})
        )

        overturned = receipt(served, work)
        assert overturned.appeal.status == "overturned" and overturned.status == "accepted" and overturned.credit > 0
        assert {v.validator for v in overturned.verdicts if v.purpose == "appeal"} == {v.address for v in fresh}
        assert receipt(served, earlier).credit == earned  # what the rejection clawed back is restored
        with make_sessionmaker(served.engine)() as session:
            assert session.get_one(Node, node.address).strikes == 0
            assert sorted(s.units for s in session.scalars(select(NodeStrike).where(NodeStrike.address == node.address))) == [
                -1,
                1,
            ]
            # The outvoted rogues lost their role; the verdicts they gave were voided and judged again.
            voided = session.scalars(
                select(Review).where(Review.validator.in_([r.address for r in rogues]), Review.voided_at.is_not(None))
            ).all()
            assert {r.submission_id for r in voided} == {earlier, work}
        standings = {s["address"]: s for s in HTTP.get(f"{served.url}/v1/public/validators").json()}
        assert [standings[r.address]["active"] for r in rogues] == [False, False]
        assert receipt(served, earlier).status == "accepted" and any(
            v.purpose == "recheck" for v in receipt(served, earlier).verdicts
        )
        check_ledger(served)


def test_appeals_are_rate_limited_and_one_validator_networks_say_what_they_waive(sqlite_url: str, tmp_path: Path) -> None:
    settings = CoordinatorSettings(
        database_url=sqlite_url,
        blob_dir=tmp_path / "blobs",
        **LIFTED,
        appeals_per_day=1,
        max_strikes=10,
    )
    with serve(settings) as served:
        make_run(served, sampling=SamplingParams(max_tokens=4), prompts=1, samples=1, audit=AuditPolicy(share=1.0))
        only = Account.create()
        grant(served, admin_token(served), only.address, "validator")
        claim_all(served, only)
        node = joined(served)
        ids = [upload(served, node, (t := lease(served, node)), finish(generate(t)).data) for _ in range(3)]
        judge_all(served, only, lambda c: "hard" if c["submission_id"] in ids[:2] else "accept")
        assert "second opinion waived" in (receipt(served, ids[0]).reason or "")
        assert receipt(served, ids[2]).status == "accepted" and "audit waived" in (receipt(served, ids[2]).reason or "")
        # Nobody that has not judged it holds the role: the appeal is refused at once, and nothing is recorded.
        before = served.snapshot()
        unheard = signed_post(
            served.url, "/v1/appeals", node, served.audience, {"address": node.address, "submission_id": ids[0]}
        )
        assert unheard.status_code == 409 and "nobody could hear" in unheard.json()["message"]
        assert {k: v for k, v in served.snapshot().items() if k != "nonces"} == {k: v for k, v in before.items() if k != "nonces"}

        other = Account.create()
        grant(served, admin_token(served), other.address, "validator")
        first = signed_post(served.url, "/v1/appeals", node, served.audience, {"address": node.address, "submission_id": ids[0]})
        assert first.status_code == 201 and first.json()["status"] == "open"
        before = served.snapshot()
        second = signed_post(served.url, "/v1/appeals", node, served.audience, {"address": node.address, "submission_id": ids[1]})
        assert second.status_code == 429 and int(second.headers["retry-after"]) > 3600
        assert {k: v for k, v in served.snapshot().items() if k != "nonces"} == {k: v for k, v in before.items() if k != "nonces"}
        assert claim_all(served, only) == []  # never decided by the validator that judged it

        # The other validator agrees with the rejection: the appeal fails, and that costs the node a strike.
        strikes = lambda: strikes_of(served, node.address)  # noqa: E731
        before_appeal = strikes()
        assert judge_all(served, other, lambda c: "hard") == [ids[0]]
        decided = receipt(served, ids[0])
        assert decided.appeal.status == "upheld" and decided.status == "rejected"
        assert strikes() == before_appeal + 1


def test_work_drawn_for_a_validator_an_admin_revokes_goes_to_another_at_once(sqlite_url: str, tmp_path: Path) -> None:
    settings = CoordinatorSettings(
        database_url=sqlite_url,
        blob_dir=tmp_path / "blobs",
        **LIFTED,
    )
    with serve(settings) as served:
        token = admin_token(served)
        make_run(served, prompts=1, samples=2, audit=NO_AUDIT)
        first, second, node = Account.create(), Account.create(), joined(served)
        for v in (first, second):
            grant(served, token, v.address, "validator")
        assert claim_all(served, first) == []  # only the first is live: what comes is drawn for it
        task = lease(served, node)
        submission = upload(served, node, task, finish(generate(task)).data)
        assert [c["submission_id"] for c in claim_all(served, first)] == [submission]

        revoked = HTTP.delete(
            f"{served.url}/v1/admin/roles/{first.address}/validator", headers={"authorization": f"Bearer {token}"}
        )
        assert revoked.status_code == 200, revoked.text
        # Not left with the revoked validator until its assignment lapses (validation_claim_s, minutes).
        assert [c["submission_id"] for c in claim_all(served, second)] == [submission]
