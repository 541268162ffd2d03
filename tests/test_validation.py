"""Validation through the real API: validators claim and post verdicts; the ledger credits
accepted work, claws back after hard rejections, bans repeat forgers; receipts are public.

Nodes here speak the protocol by hand (real keys, real signatures, files made by the node's
own code, forged ones rewritten from them); the validator is the real :class:`Validator`.
"""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime, timedelta
from hashlib import sha256
from pathlib import Path

import httpx
import pytest
from eth_account import Account
from eth_account.signers.local import LocalAccount
from rich.console import Console
from sqlalchemy import update

from intellect_protocol.coordinator.db import make_sessionmaker
from intellect_protocol.coordinator.errors import ApiError
from intellect_protocol.coordinator.models import Node, Role, Task
from intellect_protocol.coordinator.services import submissions
from intellect_protocol.coordinator.settings import CoordinatorSettings
from intellect_protocol.node.work import finish, generate
from intellect_protocol.shared.committee import PublicReceipt
from intellect_protocol.shared.links import sign_link
from intellect_protocol.shared.rollout_file import read_rollouts, write_rollouts
from intellect_protocol.shared.schemas import CHECKS, ErrorCode, SamplingParams, TaskSpec
from intellect_protocol.shared.verdicts import verdict_signer
from intellect_protocol.validator.worker import Validator
from tests.conftest import LIFTED, admin_token, serve
from tests.helpers import (
    HTTP,
    expire_assignments,
    heartbeat_body,
    keystore_json,
    make_run,
    register_body,
    signed_post,
    verdict_body,
)
from tests.support.adversary import ATTACKS
from tests.support.clock import MovableClock
from tests.support.protocol import check_ledger, claim_all, forge, grant, joined, lease, upload


@pytest.fixture
def network(sqlite_url: str, tmp_path: Path, request: pytest.FixtureRequest):
    """A coordinator with a run; a test's indirect parameter adds settings of its own."""
    settings = CoordinatorSettings(
        database_url=sqlite_url,
        blob_dir=tmp_path / "blobs",
        **LIFTED,
        newcomer_reviews_per_s=1000,
        dispute_window_s=3600,
        max_strikes=2,
        **getattr(request, "param", {}),
    )
    with serve(settings) as served:
        make_run(served, sampling=SamplingParams(max_tokens=48), prompts=2, samples=2)
        yield served, admin_token(served)


def test_a_fresh_wallets_first_forgery_bans_it(network, tmp_path: Path) -> None:
    """Round four: 200 sybil wallets each sent a forged file, took the strikes short of a ban and walked away.
    A node never credited for a file is banned by its first hard rejection."""
    served, token = network
    validator_key = Account.create()
    grant(served, token, validator_key.address, "validator")
    validator = Validator(served.url, validator_key, tmp_path / "validator", Console(quiet=True))
    sybil = joined(served)
    forged = upload(served, sybil, (task := lease(served, sybil)), forge(task))
    assert validator.run(max_submissions=1) == 1
    validator.close()
    receipt = HTTP.get(f"{served.url}/v1/public/submissions/{forged}").json()
    assert receipt["status"] == "rejected" and receipt["hard"]
    # Judged on its two shortest rows, prefilled first: the rest of the file was never prefilled.
    sampling = next(c for c in receipt["checks"] if c["name"] == "sampling")
    assert len(task.prompt_ids) * task.samples_per_prompt > 2
    assert not sampling["passed"] and len(re.findall(r"\brow \d+:", sampling["reason"])) == 2, sampling["reason"]
    with make_sessionmaker(served.engine)() as session:
        node = session.get_one(Node, sybil.address)
        assert node.status == "banned" and node.strikes == served.settings.max_strikes
    reply = signed_post(served.url, "/v1/tasks/lease", sybil, served.audience, {"address": sybil.address, "working_on": []})
    assert reply.status_code == 403 and "banned" in reply.json()["message"]


def test_honest_work_earns_credit_and_forgers_lose_theirs_then_get_banned(network, tmp_path: Path) -> None:
    served, token = network
    validator_key = Account.create()
    grant(served, token, validator_key.address, "validator")
    validator = Validator(served.url, validator_key, tmp_path / "validator", Console(quiet=True), batch=4)

    honest, cheat = joined(served), joined(served)
    good = [upload(served, honest, t, finish(generate(t)).data) for t in (lease(served, honest) for _ in range(2))]
    cheat_good = upload(served, cheat, (task := lease(served, cheat)), finish(generate(task)).data)
    assert validator.run(max_submissions=3) == 3

    receipts = {s: HTTP.get(f"{served.url}/v1/public/submissions/{s}").json() for s in [*good, cheat_good]}
    assert all(r["status"] == "accepted" and r["credit"] > 0 for r in receipts.values())
    assert [c["name"] for c in receipts[good[0]]["checks"]] == list(CHECKS)
    assert receipts[good[0]]["validator"] == validator_key.address

    forged = upload(served, cheat, (task := lease(served, cheat)), forge(task))
    validator.run(max_submissions=4)
    receipt = HTTP.get(f"{served.url}/v1/public/submissions/{forged}").json()
    assert receipt["status"] == "rejected" and receipt["hard"] and "sampling" in receipt["reason"]
    # The forger's earlier pending credit is clawed back; the honest node keeps its own.
    assert HTTP.get(f"{served.url}/v1/public/submissions/{cheat_good}").json()["credit"] == 0
    assert all(HTTP.get(f"{served.url}/v1/public/submissions/{s}").json()["credit"] > 0 for s in good)
    check_ledger(served)

    # The cheat holds one more task, leased ahead, whose file is on its way when the ban comes.
    held = lease(served, cheat)
    held_file = forge(held)
    reply = signed_post(
        served.url, "/v1/tasks/lease", cheat, served.audience, {"address": cheat.address, "working_on": [held.task_id]}
    )
    task = TaskSpec.model_validate(reply.json())
    assert task.task_id != held.task_id
    second = upload(served, cheat, task, forge(task))
    validator.run(max_submissions=5)
    with make_sessionmaker(served.engine)() as session:
        node = session.get_one(Node, cheat.address)
        assert node.strikes == 2 and node.status == "banned"
        assert session.get_one(Node, honest.address).strikes == 0
        # The ban ended its leases: the held task is offered to other nodes at once, and the file in
        # flight is refused where an upload is recorded (the lease is checked again there).
        task_row = session.get_one(Task, held.task_id)
        assert (task_row.status, task_row.leased_to) == ("open", None)
        with pytest.raises(ApiError) as refused:
            submissions.record(session, cheat.address, held.task_id, sha256(held_file).hexdigest(), [], datetime.now(UTC))
        assert refused.value.code == ErrorCode.task_not_leased
    reply = signed_post(served.url, "/v1/tasks/lease", cheat, served.audience, {"address": cheat.address})
    assert reply.status_code == 403 and reply.json()["code"] == "node_banned"
    # Banned by its strikes, not by a person: the notice says so and cites the verdicts behind them.
    notice = reply.json()["details"]["notice"]
    assert notice.startswith("banned automatically") and forged in notice and second in notice and cheat_good not in notice
    assert "intellect-node appeal" in notice
    beat = signed_post(served.url, "/v1/nodes/heartbeat", cheat, served.audience, heartbeat_body(cheat))
    assert beat.json()["action"] == "stop" and beat.json()["reason"] == notice
    refused_upload = signed_post(served.url, "/v1/submissions", cheat, served.audience, held_file, query=f"task={held.task_id}")
    assert refused_upload.status_code == 403 and refused_upload.json()["code"] == "node_banned"
    check_ledger(served)
    validator.close()

    # Each node sees its own receipts from the CLI, rejection reasons included.
    import subprocess

    for account, expected in ((honest, "accepted"), (cheat, "rejected")):
        keystore = tmp_path / f"{account.address}.json"
        keystore.write_text(keystore_json(account.key, "pw"))
        shown = subprocess.run(
            ["intellect-node", "receipts", "--wallet", str(keystore), "--coordinator", served.url],
            capture_output=True,
            text=True,
            timeout=60,
            env={**__import__("os").environ, "COLUMNS": "250"},
        )
        assert shown.returncode == 0, shown.stderr
        assert expected in shown.stdout
    assert "sampling" in shown.stdout


# Every live validator may check newcomers' files at once: at the default share (a third), the one holding exactly
# one keeps the other off them, so the draw below would hand the second validator nothing one time in ten.
@pytest.mark.parametrize("network", [{"unproven_share": 1.0}], indirect=True)
def test_work_is_drawn_for_live_validators_who_cannot_choose_and_lapses_are_drawn_again(network) -> None:
    served, token = network
    first, second, stranger = Account.create(), Account.create(), Account.create()
    grant(served, token, first.address, "validator")
    grant(served, token, second.address, "validator")

    def claim(account: LocalAccount, limit: int = 8) -> httpx.Response:
        return signed_post(
            served.url, "/v1/validation/claim", account, served.audience, {"address": account.address, "limit": limit}
        )

    assert claim(first).json() == [] and claim(second).json() == []  # both are live now
    node = joined(served)
    ids = {upload(served, node, t, finish(generate(t)).data) for t in (lease(served, node) for _ in range(6))}

    before = served.snapshot()
    assert claim(stranger).status_code == 403 and claim(stranger).json()["code"] == "role_required"
    assert served.snapshot() == before
    a = {c["submission_id"] for c in claim_all(served, first)}
    b = {c["submission_id"] for c in claim_all(served, second)}
    assert a.isdisjoint(b) and a | b == ids  # every one drawn for one of them, whoever asked first
    assert claim(first).json() == [] and claim(second).json() == []  # asking again chooses nothing

    # Only the assigned validator may read the file or post the verdict; a malformed verdict changes nothing.
    held, theirs = sorted(a | b)[0], (first, second) if sorted(a | b)[0] in a else (second, first)
    path = f"/v1/validation/submissions/{held}/file"
    from intellect_protocol.shared.signing import sign_request

    other = HTTP.get(served.url + path, headers=sign_request(theirs[1], "GET", path, "", b"", served.audience))
    assert other.status_code == 409
    mine = HTTP.get(served.url + path, headers=sign_request(theirs[0], "GET", path, "", b"", served.audience))
    assert mine.status_code == 200 and read_rollouts(mine.content)
    before = served.snapshot()
    checks = [{"name": n, "passed": True, "reason": "ok"} for n in CHECKS]
    for account, body in (
        (theirs[1], {"address": theirs[1].address, "submission_id": held, "checks": checks}),
        (theirs[0], {"address": theirs[0].address, "submission_id": held, "checks": checks[::-1]}),
        (theirs[0], {"address": theirs[0].address, "submission_id": held, "checks": checks[:3]}),
    ):
        assert signed_post(served.url, "/v1/validation/verdicts", account, served.audience, body).status_code in (409, 422)
    assert served.snapshot() == before

    # A lapsed assignment is drawn again, among validators still live.
    expire_assignments(served, held)
    with make_sessionmaker(served.engine).begin() as session:
        session.execute(
            update(Role).where(Role.address == theirs[0].address).values(last_seen=datetime.now(UTC) - timedelta(hours=1))
        )
    assert [c["submission_id"] for c in claim(theirs[1]).json()] == [held]


def test_an_admin_invalidation_claws_back_even_final_credit(sqlite_url: str, tmp_path: Path) -> None:
    settings = CoordinatorSettings(database_url=sqlite_url, blob_dir=tmp_path / "b", dispute_window_s=60)
    clock = MovableClock()
    with serve(settings, clock=clock) as served:
        make_run(served, sampling=SamplingParams(max_tokens=48))
        token = admin_token(served)
        validator_key = Account.create()
        grant(served, token, validator_key.address, "validator")
        node = joined(served)
        submission = upload(served, node, (task := lease(served, node)), finish(generate(task)).data)
        validator = Validator(served.url, validator_key, tmp_path / "v", Console(quiet=True))
        validator.run(max_submissions=1)
        validator.close()
        earned = HTTP.get(f"{served.url}/v1/public/submissions/{submission}").json()["credit"]
        assert earned > 0
        clock.advance(61)  # the dispute window passes: the credit is final
        headers = {"authorization": f"Bearer {token}"}
        reply = HTTP.post(
            f"{served.url}/v1/admin/submissions/{submission}/invalidate", json={"reason": "found copied"}, headers=headers
        )
        assert reply.status_code == 200, reply.text
        assert reply.json()["status"] == "invalidated" and reply.json()["credit"] == 0
        again = HTTP.post(f"{served.url}/v1/admin/submissions/{submission}/invalidate", json={"reason": "twice"}, headers=headers)
        assert again.status_code == 409
        with make_sessionmaker(served.engine)() as session:
            assert session.get_one(Node, node.address).strikes == 1
        check_ledger(served)


@pytest.mark.parametrize(("attack", "expected"), [(a, e) for _, a, e in ATTACKS], ids=[name for name, _, _ in ATTACKS])
def test_attacks_through_the_api_are_refused_or_rejected(network, tmp_path: Path, attack, expected: str) -> None:
    """A malicious node through the real API: the coordinator refuses the upload outright, or the
    validator rejects it with the right check; an honest submission beside it is accepted."""
    served, token = network
    validator_key = Account.create()
    grant(served, token, validator_key.address, "validator")
    cheat, honest = joined(served), joined(served)
    task = lease(served, cheat)
    rollouts = read_rollouts(finish(generate(task)).data)
    attack(rollouts, task)
    data = write_rollouts(rollouts)
    honest_id = upload(served, honest, (mine := lease(served, honest)), finish(generate(mine)).data)
    reply = signed_post(served.url, "/v1/submissions", cheat, served.audience, data, query=f"task={task.task_id}")
    validator = Validator(served.url, validator_key, tmp_path / "validator", Console(quiet=True))
    validator.run(max_submissions=2 if reply.status_code == 200 else 1)
    validator.close()
    assert HTTP.get(f"{served.url}/v1/public/submissions/{honest_id}").json()["status"] == "accepted"
    if reply.status_code != 200:
        assert reply.status_code == 422 and reply.json()["code"] == "rollout_invalid"  # refused at the door
    else:
        receipt = HTTP.get(f"{served.url}/v1/public/submissions/{reply.json()['submission_id']}").json()
        failed = {c["name"] for c in receipt["checks"] if c["passed"] is False}
        assert receipt["status"] == "rejected" and expected in failed, receipt["reason"]
        assert receipt["hard"] == (expected in {"integrity", "toploc", "sampling"})
    check_ledger(served)


def test_the_validator_command_checks_until_stopped(network, tmp_path: Path) -> None:
    from intellect_protocol.devnet.processes import script, spawn
    from intellect_protocol.shared.wallet import THROWAWAY_SCRYPT_N, create_wallet

    served, token = network
    wallet = tmp_path / "validator.json"
    grant(served, token, create_wallet(wallet, "pw", scrypt_n=THROWAWAY_SCRYPT_N), "validator")
    node = joined(served)
    submission = upload(served, node, (task := lease(served, node)), finish(generate(task)).data)
    process = spawn(
        "validator",
        [
            *script("intellect-validator"),
            "run",
            "--wallet",
            str(wallet),
            "--coordinator",
            served.url,
            "--state-dir",
            str(tmp_path / "v"),
        ],
        tmp_path / "validator.log",
        {"INTELLECT_WALLET_PASSWORD": "pw"},
    )
    try:
        deadline = time.monotonic() + 90
        while HTTP.get(f"{served.url}/v1/public/submissions/{submission}").json()["status"] == "pending":
            assert time.monotonic() < deadline and process.popen.poll() is None, process.tail()
            time.sleep(0.3)
    finally:
        assert process.stop() == 0, process.tail()
    assert HTTP.get(f"{served.url}/v1/public/submissions/{submission}").json()["status"] == "accepted"
    assert "Stopped after 1 submissions." in process.tail()


def test_a_validator_never_gets_work_of_its_own_or_linked_addresses(sqlite_url: str, tmp_path: Path) -> None:
    insider, partner, stranger = Account.create(), Account.create(), Account.create()
    settings = CoordinatorSettings(
        database_url=sqlite_url,
        blob_dir=tmp_path / "blobs",
        **LIFTED,
        linked_addresses=[[insider.address, partner.address]],
    )
    with serve(settings) as served:
        make_run(served, sampling=SamplingParams(max_tokens=48), prompts=1, samples=2)
        token = admin_token(served)
        for validator in (insider, stranger):
            grant(served, token, validator.address, "validator")

        def claim(validator: LocalAccount) -> list[str]:
            return [c["submission_id"] for c in claim_all(served, validator, 8)]

        def work_of(node: LocalAccount, **register: object) -> str:
            assert (
                signed_post(served.url, "/v1/nodes/register", node, served.audience, register_body(node, **register)).status_code
                == 200
            )
            return upload(served, node, (task := lease(served, node)), finish(generate(task)).data)

        own = work_of(insider)  # the validator's address also runs a node
        node = Account.create()  # a node the validator operates, a link the validator signed
        operated = work_of(
            node, operator_address=insider.address, operator_signature=sign_link(insider, served.audience, node.address)
        )
        grouped = work_of(partner)  # linked by the operator's setting
        assert claim(insider) == []
        assert sorted(claim(stranger)) == sorted([own, operated, grouped])


def test_verdicts_are_signed_and_anyone_can_check_who_judged(network, tmp_path: Path) -> None:
    served, token = network
    validator_key = Account.create()
    grant(served, token, validator_key.address, "validator")
    node = joined(served)
    submission = upload(served, node, (task := lease(served, node)), finish(generate(task)).data)

    # A verdict signed over other checks than it posts is refused, whoever signs the request.
    [claim] = signed_post(
        served.url, "/v1/validation/claim", validator_key, served.audience, {"address": validator_key.address, "limit": 1}
    ).json()
    passed = [{"name": n, "passed": True, "reason": "ok"} for n in CHECKS]
    forged = verdict_body(served.audience, validator_key, claim, [{**c, "reason": "other"} for c in passed]) | {"checks": passed}
    before = served.snapshot()
    reply = signed_post(served.url, "/v1/validation/verdicts", validator_key, served.audience, forged)
    assert reply.status_code == 422 and reply.json()["code"] == "body_signature_invalid"
    assert {k: v for k, v in served.snapshot().items() if k != "nonces"} == {k: v for k, v in before.items() if k != "nonces"}
    expire_assignments(served, submission)  # the claim ends; the real validator takes it

    validator = Validator(served.url, validator_key, tmp_path / "v", Console(quiet=True))
    validator.run(max_submissions=1)
    validator.close()
    receipt = PublicReceipt.model_validate(HTTP.get(f"{served.url}/v1/public/submissions/{submission}").json())
    assert receipt.status == "accepted" and receipt.verdict_signature
    signer = verdict_signer(
        receipt.verdict_signature, served.audience, submission, receipt.sha256, receipt.checks or [], receipt.untrained_rows
    )
    assert signer == validator_key.address == receipt.validator
    other_audience = verdict_signer(
        receipt.verdict_signature, "another-deployment", submission, receipt.sha256, receipt.checks or [], receipt.untrained_rows
    )
    assert other_audience != validator_key.address
