"""Hostile parties against the accountability layer (round three of independent attacks), each
through the real API: links nobody signed, splits on a thin committee, reviews nobody can judge,
appeal floods, and what a caught rogue validator had already waved through."""

from __future__ import annotations

import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from eth_account import Account
from sqlalchemy import select, update
from typer.testing import CliRunner

from intellect_protocol.coordinator.db import make_sessionmaker
from intellect_protocol.coordinator.models import Node, Run, ValidatorStrike
from intellect_protocol.coordinator.services import committee
from intellect_protocol.coordinator.services.independence import linked
from intellect_protocol.coordinator.settings import CoordinatorSettings
from intellect_protocol.node.cli import app as node_cli
from intellect_protocol.node.work import finish, generate
from intellect_protocol.shared.links import sign_link
from intellect_protocol.shared.run_schemas import AuditPolicy
from intellect_protocol.shared.schemas import SamplingParams
from tests.conftest import Served, admin_token, serve
from tests.helpers import HTTP, keystore_json, make_run, register_body, signed_post
from tests.support.clock import MovableClock
from tests.support.protocol import claim_all, forge, grant, joined, lease, upload
from tests.test_committee import judge_all, receipt, strikes_of, trainer_page

FAST = {
    "rate_limit_per_s": 5000,
    "rate_limit_burst": 5000,
    "registrations_per_ip_per_hour": 1000,
    "newcomer_uploads_per_s": 5000,
    "newcomer_reviews_per_s": 5000,
}
NEW_VALIDATORS_TRUSTED = AuditPolicy(share=0, new_node_share=0, suspect_share=1.0, new_validator_verdicts=0)
"""No random audits: only suspicion (a node called forged, a validator outvoted) brings a second look."""


def without_nonces(snapshot: dict[str, list[tuple]]) -> dict[str, list[tuple]]:
    return {k: v for k, v in snapshot.items() if k != "nonces"}


def validator_strikes(served: Served) -> dict[str, int]:
    with make_sessionmaker(served.engine)() as session:
        out: dict[str, int] = {}
        for s in session.scalars(select(ValidatorStrike)):
            out[s.validator] = out.get(s.validator, 0) + 1
        return out


def test_a_node_cannot_link_itself_to_a_validator_it_does_not_control(sqlite_url: str, tmp_path: Path) -> None:
    """The attack: a forger names an honest validator as its operator to keep it out of its committee."""
    with serve(CoordinatorSettings(database_url=sqlite_url, blob_dir=tmp_path / "blobs", **FAST)) as served:
        honest = Account.create()
        grant(served, admin_token(served), honest.address, "validator")
        forger = Account.create()
        before = without_nonces(served.snapshot())
        lies = [
            {"operator_address": honest.address},  # the node's word alone
            {
                "operator_address": honest.address,
                "operator_signature": sign_link(forger, served.audience, forger.address),
            },  # signed by itself
            {
                "operator_address": honest.address,
                "operator_signature": sign_link(honest, "another-deployment", forger.address),
            },  # replayed
            {
                "operator_address": honest.address,
                "operator_signature": sign_link(honest, served.audience, Account.create().address),
            },  # another node's
            {"operator_address": honest.address, "operator_signature": "0x" + "ab" * 65},  # malformed
        ]
        for lie in lies:
            reply = signed_post(served.url, "/v1/nodes/register", forger, served.audience, register_body(forger, **lie))
            assert reply.status_code == 422 and "operator_signature" in reply.json()["message"], reply.text
        assert without_nonces(served.snapshot()) == before

        # The operator's own signature, made with its wallet by the CLI, makes the link; then it counts.
        wallet = tmp_path / "operator.json"
        wallet.write_text(keystore_json(honest.key, "pw"))
        made = CliRunner().invoke(
            node_cli,
            ["link-operator", "--node", forger.address, "--wallet", str(wallet), "--coordinator", served.url],
            env={"INTELLECT_WALLET_PASSWORD": "pw"},
        )
        assert made.exit_code == 0, made.output
        signature = made.output.split("--operator-signature ")[1].split()[0]
        unsigned = CliRunner().invoke(
            node_cli, ["join", "--wallet", str(wallet), "--operator", honest.address, "--coordinator", served.url]
        )
        assert unsigned.exit_code == 2 and "go together" in unsigned.output, unsigned.output
        signed = {"operator_address": honest.address, "operator_signature": signature}
        assert (
            signed_post(served.url, "/v1/nodes/register", forger, served.audience, register_body(forger, **signed)).status_code
            == 200
        )
        with make_sessionmaker(served.engine)() as session:
            assert forger.address in linked(session, honest.address, served.settings)


def test_a_split_on_a_thin_committee_is_held_and_the_forger_is_struck_once_a_third_judges(
    sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A scan this small would be filled by held reviews alone if they were drawn for again and again.
    monkeypatch.setattr(committee, "ASSIGN_SCAN", 2)
    settings = CoordinatorSettings(database_url=sqlite_url, blob_dir=tmp_path / "blobs", validator_max_strikes=10, **FAST)
    with serve(settings) as served:
        run_id = make_run_with(served, NEW_VALIDATORS_TRUSTED)
        token = admin_token(served)
        rogue, honest, third = Account.create(), Account.create(), Account.create()
        for v in (rogue, honest):
            grant(served, token, v.address, "validator")
        forger, worker = joined(served), joined(served)

        held = []
        for _ in range(3):
            sid = upload(served, forger, (t := lease(served, forger)), forge(t))
            # Whoever looks first, the other one disagrees: the honest one says forged, the rogue approves.
            while not receipt(served, sid).held:
                judge_all(served, honest, lambda c: "hard")
                judge_all(served, rogue, lambda c: "accept")
            held.append(sid)
        for sid in held:
            r = receipt(served, sid)
            assert r.status == "pending" and r.held and "no independent third validator" in (r.reason or ""), r.reason
            assert r.credit == 0
        assert (
            validator_strikes(served) == {} and strikes_of(served, forger.address) == 0
        )  # neither side struck on a thin committee
        # Held files are not a backlog the run waits for, but the forger gets no more work meanwhile.
        wait = signed_post(served.url, "/v1/tasks/lease", forger, served.audience, {"address": forger.address})
        assert wait.status_code == 204 and wait.headers["x-intellect-wait"] == "held", wait.headers

        # Honest work is drawn for at once although held reviews are older and fill the scan.
        fine = upload(served, worker, (t := lease(served, worker)), finish(generate(t)).data)
        judged = judge_all(served, honest, lambda c: "accept") + judge_all(served, rogue, lambda c: "accept")
        assert judged == [fine] and receipt(served, fine).status == "accepted"

        # The held files go stale: a forger does not escape by outwaiting its committee.
        with make_sessionmaker(served.engine).begin() as session:
            session.execute(update(Run).where(Run.id == run_id).values(policy_step=50))
        claim_all(served, honest)
        assert all(receipt(served, sid).status == "pending" for sid in held)

        grant(served, token, third.address, "validator")
        broken: list[str] = []
        while batch := judge_all(
            served, third, lambda c: "hard" if c["submission_id"] in held else "accept"
        ):  # a scan of two: two at a time
            broken += batch
        # Besides the ties, perhaps the honest file: if the rogue alone had accepted it, its strikes
        # here withhold that acceptance for an audit (the trainer had not read it).
        assert set(held) <= set(broken) <= {*held, fine}, (broken, held)
        for sid in held:
            r = receipt(served, sid)
            assert r.status == "rejected" and r.hard and not r.held
        assert strikes_of(served, forger.address) == 5  # never credited: banned on its first forgery (3), then 1 each
        assert validator_strikes(served) == {rogue.address: 3}


def test_reviews_and_appeals_nobody_can_judge_never_delay_honest_validation(
    sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The flood: wallets appeal files every validator judged already; all are refused, nothing
    waits, and honest work behind them is drawn for at once."""
    monkeypatch.setattr(committee, "ASSIGN_SCAN", 2)
    settings = CoordinatorSettings(database_url=sqlite_url, blob_dir=tmp_path / "blobs", dispute_window_s=3600, **FAST)
    with serve(settings) as served:
        make_run_with(served, AuditPolicy(share=1.0))
        token = admin_token(served)
        first, second = Account.create(), Account.create()
        for v in (first, second):
            grant(served, token, v.address, "validator")
        wallets = [joined(served) for _ in range(6)]
        rejected = [upload(served, w, (t := lease(served, w)), finish(generate(t)).data) for w in wallets]
        while judge_all(served, first, lambda c: "soft") + judge_all(served, second, lambda c: "soft"):
            pass
        assert all(receipt(served, sid).status == "rejected" for sid in rejected)
        before = without_nonces(served.snapshot())
        for w, sid in zip(wallets, rejected, strict=True):
            reply = signed_post(served.url, "/v1/appeals", w, served.audience, {"address": w.address, "submission_id": sid})
            assert reply.status_code == 409 and "nobody could hear" in reply.json()["message"]
        assert without_nonces(served.snapshot()) == before

        honest = joined(served)
        fine = upload(served, honest, (t := lease(served, honest)), finish(generate(t)).data)
        while judge_all(served, first, lambda c: "accept") + judge_all(served, second, lambda c: "accept"):
            pass
        assert receipt(served, fine).status == "accepted"


def test_a_caught_validators_unread_approvals_are_withheld_and_what_was_trained_is_counted(
    sqlite_url: str, tmp_path: Path
) -> None:
    settings = CoordinatorSettings(
        database_url=sqlite_url, blob_dir=tmp_path / "blobs", validator_live_s=30, validator_max_strikes=3, **FAST
    )
    clock = MovableClock()
    with serve(settings, clock=clock) as served:
        run_id = make_run_with(served, NEW_VALIDATORS_TRUSTED)
        token = admin_token(served)
        rogue, first, second, trainer = (Account.create() for _ in range(4))
        for v in (rogue, first, second):
            grant(served, token, v.address, "validator")
        grant(served, token, trainer.address, "trainer")
        forger = joined(served)

        claim_all(served, rogue)  # the only live validator: it alone decides the forger's first four files
        waved = [upload(served, forger, (t := lease(served, forger)), forge(t)) for _ in range(4)]
        assert sorted(judge_all(served, rogue, lambda c: "accept")) == sorted(waved)
        assert all(receipt(served, sid).status == "accepted" for sid in waved)
        read = trainer_page(served, trainer, run_id, limit=2)  # the trainer reads two of them ...
        trainer_page(served, trainer, run_id, after=read[-1]["cursor"], limit=1)  # ... and says it used them
        trained = {r["submission_id"] for r in read}

        # The rogue is outvoted once: an honest validator calls the next file forged, the rogue
        # approves it as second opinion, and a third honest validator breaks the tie.
        clock.advance(31)  # the rogue falls out of the live set: the honest one is drawn for the first look
        nxt = upload(served, forger, (t := lease(served, forger)), forge(t))
        assert judge_all(served, first, lambda c: "hard") == [nxt]
        assert judge_all(served, rogue, lambda c: "accept") == [nxt]
        assert judge_all(served, second, lambda c: "hard") == [nxt]
        assert validator_strikes(served) == {rogue.address: 1}

        # Everything it decided alone that the trainer had not read is withheld and audited.
        unread = set(waved) - trained
        for sid in unread:
            r = receipt(served, sid)
            assert r.status == "pending" and "withheld" in (r.reason or ""), r.reason
        assert all(receipt(served, sid).status == "accepted" for sid in trained)
        assert not {r["submission_id"] for r in trainer_page(served, trainer, run_id, after=read[-1]["cursor"])} & unread

        # The audits find the forgeries; the rogue, outvoted three times, loses its role, its verdicts are
        # re-judged, and what the trainer had already read is counted against it.
        for _ in range(10):
            if not (judge_all(served, first, lambda c: "hard") + judge_all(served, second, lambda c: "hard")):
                break
        assert all(receipt(served, sid).status == "rejected" for sid in waved)
        rows = sum(receipt(served, sid).trained_rows or 0 for sid in trained)
        assert rows == 2 * 2 and all(
            receipt(served, sid).trained_rows == 0 for sid in unread
        )  # 2 files x 2 rows; none of the withheld
        standing = {s["address"]: s for s in HTTP.get(f"{served.url}/v1/public/validators").json()}
        assert not standing[rogue.address]["active"] and standing[rogue.address]["rows_trained_then_rejected"] == rows
        assert standing[first.address]["rows_trained_then_rejected"] == 0
        with make_sessionmaker(served.engine)() as session:
            assert session.get_one(Node, forger.address).status == "banned"


def make_run_with(served: Served, audit: AuditPolicy) -> str:
    return make_run(served, sampling=SamplingParams(max_tokens=4), prompts=1, samples=2, audit=audit)


def _declare_upload(served: Served, headers: dict[str, str], task_id: str) -> int:
    """Send an upload's headers declaring 64 MiB and its first mebibyte, then wait for the answer
    without sending the rest; the status the coordinator answered with."""
    host, port = served.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as conn:
        head = f"POST /v1/submissions?task={task_id} HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/octet-stream\r\n"
        head += f"content-length: {64 << 20}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
        conn.sendall(head.encode() + b"\0" * (1 << 20))
        return int(conn.recv(4096).split(b" ", 2)[1])


class StagingWatch:
    """The most bytes the coordinator's staging directory held while the block ran."""

    def __init__(self, directory: Path) -> None:
        self.directory, self.most, self.stop = directory, 0, threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            held = sum(f.stat().st_size for f in self.directory.glob("*") if f.is_file()) if self.directory.exists() else 0
            self.most = max(self.most, held)
            time.sleep(0.002)

    def __enter__(self) -> StagingWatch:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.thread.join()


def test_upload_bodies_condemned_by_their_headers_are_never_staged(sqlite_url: str, tmp_path: Path) -> None:
    from intellect_protocol.shared.signing import sign_request

    settings = CoordinatorSettings(database_url=sqlite_url, blob_dir=tmp_path / "blobs", body_idle_timeout_s=1.0, **FAST)
    with serve(settings) as served:
        make_run_with(served, AuditPolicy())
        node = joined(served)
        task = lease(served, node)
        incoming = tmp_path / "blobs" / ".incoming"
        query = f"task={task.task_id}"

        # Twelve strangers' 64 MiB bodies (fresh wallets, well-formed signatures over nothing): each
        # refused from its headers; the staging directory never holds a byte of them.
        strangers = [sign_request(Account.create(), "POST", "/v1/submissions", query, b"", served.audience) for _ in range(12)]
        with StagingWatch(incoming) as watch, ThreadPoolExecutor(12) as pool:
            answers = list(pool.map(lambda h: _declare_upload(served, h, task.task_id), strangers))
        assert answers == [404] * 12 and watch.most == 0

        # Someone who knows the node's live task id and claims its address is refused from the headers: the
        # signature over the declared body hash is not the node's. Not a byte of theirs is staged, and the
        # node's own upload beside six such trickling bodies goes through (before, they filled the address's
        # share of three staged uploads and the node's was refused 429 until its lease ran out).
        claims = [{**h, "x-intellect-address": node.address} for h in strangers[:6]]
        data = finish(generate(task)).data
        headers = sign_request(node, "POST", "/v1/submissions", query, data, served.audience)
        with StagingWatch(incoming) as watch, ThreadPoolExecutor(6) as pool:
            trickling = [pool.submit(_declare_upload, served, h, task.task_id) for h in claims]
            time.sleep(0.3)  # their first mebibytes are sent
            own = HTTP.post(f"{served.url}/v1/submissions?{query}", content=data, headers=headers)
            answers = [t.result() for t in trickling]
        assert own.status_code == 200, own.text
        assert answers == [401] * 6 and watch.most <= len(data), (answers, watch.most)

        # Its nonce, used again, is refused before its body is read.
        with StagingWatch(incoming) as watch:
            assert _declare_upload(served, headers, task.task_id) == 401
        assert watch.most == 0
