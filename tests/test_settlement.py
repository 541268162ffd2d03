"""Settlement against a real chain (anvil on loopback) and real coordinators: epochs close from
final credit and anchor once, claims pay through ``intellect-node claim``, ``verify-epoch``
rebuilds every root from the public ledger, stakes bond and unbond; the chain being down or a
crash between posting and recording loses nothing and posts nothing twice."""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from eth_account import Account
from sqlalchemy import select
from typer.testing import CliRunner

from intellect_protocol.coordinator.anchoring import CHAIN_PASSWORD_ENV, Anchorer
from intellect_protocol.coordinator.db import make_sessionmaker
from intellect_protocol.coordinator.models import ContributionEntry, Submission, Task
from intellect_protocol.coordinator.services.settlement import close_epoch
from intellect_protocol.coordinator.settings import CoordinatorSettings
from intellect_protocol.devnet.anvil import fund, rpc, start_anvil
from intellect_protocol.devnet.processes import StartError, free_port
from intellect_protocol.node.cli import app as node_cli
from intellect_protocol.shared.chain import Settlement, connect
from intellect_protocol.shared.money import CREDIT_PER_UNIT, TOKEN
from tests.conftest import LIFTED, ON_POSTGRES_ONLY, Served, admin_token, serve
from tests.helpers import HTTP, keystore_json, make_run, register_body, signed_post

PASSWORD = "test-password"  # conftest's INTELLECT_WALLET_PASSWORD


@pytest.fixture(scope="module")
def anvil(tmp_path_factory: pytest.TempPathFactory):
    try:
        process = start_anvil(tmp_path_factory.mktemp("anvil") / "anvil.log")
    except StartError as e:
        if os.environ.get("CI"):
            pytest.fail(f"{e}; .ci/run must install it")
        pytest.skip(str(e))
    yield process.url
    process.stop()


@pytest.fixture
def chain(anvil: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Fresh contracts, and the coordinator's sender (admin, poster, slasher) in a keystore."""
    admin = Account.create()
    fund(anvil, admin.address, 100 * TOKEN)
    settlement = Settlement.deploy(connect(anvil), admin, unbonding_s=60, reward_supply=1_000_000 * TOKEN)
    keystore = tmp_path / "chain-sender.json"
    keystore.write_text(keystore_json(admin.key, "chain-password"))
    monkeypatch.setenv(CHAIN_PASSWORD_ENV, "chain-password")
    return settlement, admin, keystore


CUTOFF_LAG_S = 2
"""Cutoffs trail the clock this much: anvil estimates gas on a block whose time is the last one's."""


def settled(database_url: str, tmp_path: Path, rpc_url: str, settlement: Settlement, keystore: Path) -> CoordinatorSettings:
    return CoordinatorSettings(
        database_url=database_url,
        blob_dir=tmp_path / "blobs",
        **LIFTED,
        chain_rpc_url=rpc_url,
        chain_token=settlement.token.address,
        chain_stake_registry=settlement.registry.address,
        chain_distributor=settlement.distributor.address,
        chain_keystore=keystore,
        epoch_s=0.3,
        chain_cutoff_lag_s=CUTOFF_LAG_S,
    )


def wallet(tmp_path: Path, anvil: str | None = None):
    account = Account.create()
    path = tmp_path / f"{account.address}.json"
    path.write_text(keystore_json(account.key, PASSWORD))
    if anvil is not None:
        fund(anvil, account.address, 10 * TOKEN)
    return account, path


def lay_credit(served: Served, run_id: str, address: str, units: str, final: bool = True, kind: str = "credit") -> None:
    """One ledger entry of ``units`` work units (an exact decimal), final now or in an hour."""
    lay_credits(served, run_id, [(address, units, kind)], final)


def lay_credits(served: Served, run_id: str, entries: list[tuple[str, str, str]], final: bool = True) -> None:
    """Ledger entries ``(address, units, kind)`` (with the tasks and submissions they belong to), in
    one transaction: an epoch closing meanwhile sees all of them or none."""
    now = datetime.now(UTC)
    final_at = now - timedelta(seconds=CUTOFF_LAG_S + 2) if final else now + timedelta(hours=1)
    with make_sessionmaker(served.engine).begin() as session:
        for address, units, kind in entries:
            name = uuid.uuid4().hex[:12]
            session.add(
                Task(
                    id=f"t-{name}",
                    run_id=run_id,
                    prompt_ids={"ids": []},
                    seed=1,
                    policy_step=0,
                    status="submitted",
                    created_at=now,
                )
            )
            session.flush()
            session.add(
                Submission(
                    id=f"s-{name}",
                    task_id=f"t-{name}",
                    run_id=run_id,
                    address=address,
                    sha256="0" * 64,
                    blob_key=name,
                    rows=1,
                    tokens=1,
                    status="accepted",
                    created_at=now,
                )
            )
            session.flush()
            session.add(
                ContributionEntry(
                    address=address,
                    submission_id=f"s-{name}",
                    kind=kind,
                    units=int(Decimal(units) * CREDIT_PER_UNIT),
                    reason="",
                    created_at=now,
                    final_at=final_at,
                )
            )


def anchored(served: Served, epoch: int, timeout: float = 30) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = HTTP.get(f"{served.url}/v1/public/epochs").json()
        done = [e for e in found if e["epoch"] == epoch and e["tx_hash"]]
        if done:
            return done[0]
        time.sleep(0.1)
    raise AssertionError(f"epoch {epoch} not anchored: {found}, health {HTTP.get(f'{served.url}/healthz').json()}")


def admin_headers(served: Served) -> dict[str, str]:
    return {"authorization": f"Bearer {admin_token(served)}"}


def node(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(node_cli, list(args))
    return result.exit_code, result.output


@ON_POSTGRES_ONLY
def test_epochs_anchor_final_credit_claims_pay_and_anyone_can_rebuild_every_root(database_url, tmp_path, anvil, chain) -> None:
    settlement, _, keystore = chain
    (alice, alice_wallet), (bob, bob_wallet) = wallet(tmp_path, anvil), wallet(tmp_path, anvil)
    carol, carol_wallet = wallet(tmp_path)
    with serve(settled(database_url, tmp_path, anvil, settlement, keystore)) as served:
        advertised = HTTP.get(f"{served.url}/v1/public/chain").json()
        assert advertised["distributor"] == settlement.distributor.address
        assert advertised["token_decimals"] == settlement.token.functions.decimals().call()
        run_id = make_run(served)
        lay_credits(served, run_id, [(alice.address, "3.5", "credit"), (bob.address, "2.0", "credit")])
        lay_credit(served, run_id, carol.address, "9.0", final=False)  # still inside the dispute window: not in the tree
        first = anchored(served, 1)
        assert settlement.root_at(1).hex() == first["root"].removeprefix("0x") and first["addresses"] == 2
        assert first["total"] == str(11 * TOKEN // 2)

        code, out = node("claim", "--wallet", str(alice_wallet), "--coordinator", served.url)
        assert code == 0 and "Claimed 3.5" in out, out
        assert settlement.token.functions.balanceOf(alice.address).call() == 7 * TOKEN // 2
        code, out = node("claim", "--wallet", str(alice_wallet), "--coordinator", served.url)
        assert code == 0 and "Nothing to claim: 3.5 claimed already" in out, out

        # Credit a root counts is never clawed back: the chain may pay it already. An admin finding
        # bob's work invalid afterwards leaves his anchored credit where it is.
        with make_sessionmaker(served.engine)() as session:
            bobs = session.scalar(select(ContributionEntry.submission_id).where(ContributionEntry.address == bob.address))
        reply = HTTP.post(
            f"{served.url}/v1/admin/submissions/{bobs}/invalidate", json={"reason": "found later"}, headers=admin_headers(served)
        )
        assert reply.status_code == 200 and reply.json()["credit"] == 2 * CREDIT_PER_UNIT, reply.text

        # Epoch 2: alice earns more, bob's credit is clawed back (no leaf: nothing positive to claim).
        lay_credits(served, run_id, [(alice.address, "1.25", "credit"), (bob.address, "-2.0", "clawback")])
        second = anchored(served, 2)
        assert second["addresses"] == 1
        code, out = node("claim", "--wallet", str(alice_wallet), "--coordinator", served.url)
        assert code == 0 and "Claimed 1.25" in out, out
        code, out = node("claim", "--wallet", str(bob_wallet), "--coordinator", served.url)
        assert code == 0 and "has no credit left in this coordinator's ledger, after clawbacks" in out, out
        assert settlement.token.functions.balanceOf(bob.address).call() == 0
        # What waiting will change, and what it will not.
        code, out = node("claim", "--wallet", str(carol_wallet), "--coordinator", served.url)
        assert code == 0 and "Nothing to claim yet: 9 credit is pending; it turns final after the dispute window" in out, out
        assert signed_post(served.url, "/v1/nodes/register", bob, served.audience, register_body(bob)).status_code == 200
        reply = HTTP.post(
            f"{served.url}/v1/admin/nodes/{bob.address}/ban", json={"reason": "forged work"}, headers=admin_headers(served)
        )
        assert reply.status_code == 200, reply.text
        code, out = node("claim", "--wallet", str(bob_wallet), "--coordinator", served.url)
        assert code == 0 and "Nothing to claim, now or later" in out and "is banned" in out, out

        code, out = node("verify-epoch", "--coordinator", served.url)
        assert code == 0 and "epoch 1" in out and "epoch 2" in out and out.count("matches the chain") == 2, out

        # Nothing changed: no epoch 3, no gas spent.
        time.sleep(1.5)
        assert [e["epoch"] for e in HTTP.get(f"{served.url}/v1/public/epochs").json()] == [2, 1]
        proof = HTTP.get(f"{served.url}/v1/public/epochs/2/proofs/{alice.address}").json()
        assert proof["cumulative"] == str(19 * TOKEN // 4)
        assert HTTP.get(f"{served.url}/v1/public/epochs/2/proofs/{bob.address}").status_code == 404
        assert HTTP.get(f"{served.url}/v1/public/epochs/0/proofs/{bob.address}").status_code == 422
        assert HTTP.get(f"{served.url}/v1/public/epochs/1/proofs/not-an-address").status_code == 422


@contextmanager
def forwarding(target: str, before: Callable[[], None], on: str = "/proofs/") -> Iterator[str]:
    """A loopback HTTP server in front of ``target`` that calls ``before`` once, before it forwards the first
    request whose path holds ``on``: by default a claim proof, the point where a real claim may be overtaken by
    a new root."""
    pending = [before]

    class Forward(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if on in self.path and pending:
                pending.pop()()
            reply = HTTP.get(target + self.path)
            self.send_response(reply.status_code)
            self.send_header("content-type", reply.headers.get("content-type", "application/json"))
            self.send_header("content-length", str(len(reply.content)))
            self.end_headers()
            self.wfile.write(reply.content)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Forward)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        assert not pending, f"nothing holding {on} was asked for"


def test_a_claim_overtaken_by_a_new_root_claims_again_against_it(sqlite_url, tmp_path, anvil, chain) -> None:
    settlement, _, keystore = chain
    alice, alice_wallet = wallet(tmp_path, anvil)
    with serve(settled(sqlite_url, tmp_path, anvil, settlement, keystore)) as served:
        run_id = make_run(served)
        lay_credit(served, run_id, alice.address, "3.5")
        anchored(served, 1)

        def new_root() -> None:
            lay_credit(served, run_id, alice.address, "1.25")
            anchored(served, 2)

        with forwarding(served.url, new_root) as url:
            code, out = node("claim", "--wallet", str(alice_wallet), "--coordinator", url)
        assert code == 0 and "A newer root landed on chain while claiming against epoch 1" in out and "Claimed 4.75" in out, out
        assert settlement.token.functions.balanceOf(alice.address).call() == 19 * TOKEN // 4


def test_an_epoch_listed_and_anchored_while_verify_epoch_reads_waits_rather_than_fails(
    sqlite_url, tmp_path, anvil, chain
) -> None:
    settlement, _, keystore = chain
    alice = Account.create().address
    with serve(settled(sqlite_url, tmp_path, anvil, settlement, keystore)) as served:
        run_id = make_run(served)
        lay_credit(served, run_id, alice, "1.0")
        anchored(served, 1)

        def next_epoch() -> None:  # after the audit read the chain, before it reads the coordinator's list
            lay_credit(served, run_id, alice, "2.0")
            anchored(served, 2)

        with forwarding(served.url, next_epoch, on="/v1/public/epochs?") as url:
            code, out = node("verify-epoch", "--coordinator", url)
        assert code == 0 and "✓ epoch 1" in out and "epoch 2: waiting to be anchored" in out, out
        code, out = node("verify-epoch", "--coordinator", served.url)
        assert code == 0 and "✓ epoch 2" in out, out


def test_the_ledger_goes_on_while_the_chain_is_down_and_nothing_is_posted_twice(sqlite_url, tmp_path, anvil, chain) -> None:
    settlement, admin, keystore = chain
    w3 = settlement.w3
    down = settled(sqlite_url, tmp_path, f"http://127.0.0.1:{free_port()}", settlement, keystore)
    with serve(down) as served:
        run_id = make_run(served)
        lay_credit(served, run_id, Account.create().address, "1.0")
        # The epoch closes first and the post to the dead chain fails after: wait for both to show.
        deadline = time.monotonic() + 20
        while (health := HTTP.get(f"{served.url}/healthz")).json()["settlement"]["unanchored_epochs"] < 1 or health.json()[
            "settlement"
        ]["chain"] == "ok":
            assert time.monotonic() < deadline, health.json()
            time.sleep(0.1)
        assert health.status_code == 200  # a chain outage is reported, never a reason for 503
    live = settled(sqlite_url, tmp_path, anvil, settlement, keystore)
    with serve(live) as served:
        assert anchored(served, 1)["root"] == "0x" + settlement.root_at(1).hex()  # caught up after the outage

    # A crash after the root was sent but before it was recorded: the next pass reads it back from
    # the chain instead of sending it again.
    lay_credit(served, run_id, Account.create().address, "2.0")
    sessions = make_sessionmaker(served.engine)
    with sessions.begin() as session:
        epoch = close_epoch(session, datetime.now(UTC), CUTOFF_LAG_S)
        assert epoch is not None and epoch.epoch == 2
        root = bytes.fromhex(epoch.root.removeprefix("0x"))
    deployed_by = w3.eth.block_number  # events are read from a deployment's block on, not from genesis
    sent = settlement.transact(admin, settlement.distributor.functions.post_root(2, root, int(epoch.cutoff.timestamp())))
    nonce = w3.eth.get_transaction_count(admin.address)
    anchorer = Anchorer(sessions, live.model_copy(update={"epoch_s": 3600, "chain_from_block": deployed_by}))
    anchorer.tick()
    assert anchorer.status()["unanchored_epochs"] == 0 and anchorer.chain_error is None
    assert w3.eth.get_transaction_count(admin.address) == nonce
    with served.engine.connect() as connection:
        from sqlalchemy import text

        assert (
            connection.execute(text("SELECT tx_hash FROM epoch_anchors WHERE epoch = 2")).scalar()
            == sent["transactionHash"].to_0x_hex()
        )

    # Another root on chain for the next epoch (a second poster): refused, said, never overwritten;
    # verify-epoch flags that epoch.
    lay_credit(served, run_id, Account.create().address, "3.0")
    settlement.transact(
        admin, settlement.distributor.functions.post_root(3, b"\x66" * 32, w3.eth.get_block("latest")["timestamp"])
    )
    with sessions.begin() as session:
        assert close_epoch(session, datetime.now(UTC), CUTOFF_LAG_S) is not None
    anchorer.tick()
    assert "another root" in (anchorer.chain_error or "") and anchorer.status()["unanchored_epochs"] == 1
    with serve(live) as served:
        code, out = node("verify-epoch", "3", "--coordinator", served.url)
        assert code == 6 and "✗ epoch 3" in out, out
        code, out = node("verify-epoch", "1", "--coordinator", served.url)
        assert code == 0, out

        # A root the coordinator never listed (another poster's): the audit reads every root the
        # contract accepted from its events, so it finds it, although no listing names it.
        settlement.transact(
            admin, settlement.distributor.functions.post_root(9, b"\x77" * 32, w3.eth.get_block("latest")["timestamp"])
        )
        code, out = node("verify-epoch", "--coordinator", served.url)
        assert code == 6 and "✗ epoch 9: the chain holds a root the coordinator does not list" in out, out
        assert "✗ epoch 3: the coordinator lists transaction none" in out and "✓ epoch 1" in out, out


def test_stake_unbond_withdraw_and_every_failure_says_why(sqlite_url, tmp_path, anvil, chain) -> None:
    settlement, admin, keystore = chain
    account, path = wallet(tmp_path, anvil)
    settlement.transact(admin, settlement.token.functions.mint(account.address, 50 * TOKEN))
    with serve(settled(sqlite_url, tmp_path, anvil, settlement, keystore)) as served:
        args = ["--wallet", str(path), "--coordinator", served.url]
        code, out = node("stake", "10", *args)
        assert code == 0 and "now stakes 10" in out, out
        assert settlement.stake_of(account.address) == 10 * TOKEN
        code, out = node("stake", "51", *args)
        assert code == 5 and "less than 51" in out and "ask the coordinator's operator" in out, out
        assert node("stake", "0", *args)[0] == 1 and node("stake", "1.5x", *args)[0] == 1
        code, out = node("unstake", "--withdraw", *args)
        assert code == 5 and "no stake unbonding" in out, out
        code, out = node("unstake", "11", *args)
        assert code == 5 and "stakes 10, less than 11" in out, out
        code, out = node("unstake", "4", *args)
        assert code == 0 and "4 unbonding" in out, out
        code, out = node("unstake", "--withdraw", *args)
        assert code == 5 and "still unbonding" in out, out
        rpc(anvil, "evm_increaseTime", 61)
        rpc(anvil, "evm_mine")
        code, out = node("unstake", "--withdraw", *args)
        assert code == 0 and "Withdrew 4" in out, out
        assert settlement.token.functions.balanceOf(account.address).call() == 44 * TOKEN

        broke, broke_path = wallet(tmp_path)  # tokens, but no ETH for gas
        settlement.transact(admin, settlement.token.functions.mint(broke.address, 5 * TOKEN))
        code, out = node("stake", "1", "--wallet", str(broke_path), "--coordinator", served.url)
        assert code == 5 and "insufficient gas" in out, out
        code, out = node("claim", *args)
        assert code == 0 and "Nothing to claim: no epoch" in out, out

    plain = CoordinatorSettings(database_url=sqlite_url, blob_dir=tmp_path / "blobs")
    with serve(plain) as served:
        assert HTTP.get(f"{served.url}/v1/public/chain").json() == {
            "enabled": False,
            "rpc_url": None,
            "chain_id": None,
            "token": None,
            "stake_registry": None,
            "distributor": None,
            "sender": None,
            "from_block": 0,
            "token_decimals": 18,
        }
        code, out = node("claim", "--wallet", str(path), "--coordinator", served.url)
        assert code == 2 and "does not settle on a chain" in out, out


def test_a_run_with_a_minimum_stake_leases_only_to_staked_nodes(sqlite_url, tmp_path, anvil, chain) -> None:
    settlement, admin, keystore = chain
    account, path = wallet(tmp_path, anvil)
    settlement.transact(admin, settlement.token.functions.mint(account.address, 50 * TOKEN))
    with serve(settled(sqlite_url, tmp_path, anvil, settlement, keystore)) as served:
        headers = {"authorization": f"Bearer {admin_token(served)}"}
        body = {
            "name": "staked",
            "min_stake": str(20 * TOKEN),
            "sampling": {"max_tokens": 8},
            "prompts_per_task": 2,
            "samples_per_prompt": 2,
        }
        run = HTTP.post(f"{served.url}/v1/admin/runs", json=body, headers=headers)
        assert run.status_code == 201 and run.json()["min_stake"] == str(20 * TOKEN), run.text
        assert signed_post(served.url, "/v1/nodes/register", account, served.audience, register_body(account)).status_code == 200
        lease = {"address": account.address, "run_id": run.json()["id"]}
        refused = signed_post(served.url, "/v1/tasks/lease", account, served.audience, lease)
        assert refused.status_code == 403 and refused.json()["code"] == "stake_too_low", refused.text
        assert "needs 20 tokens staked" in refused.json()["message"]
        assert node("stake", "20", "--wallet", str(path), "--coordinator", served.url)[0] == 0
        deadline = time.monotonic() + 15  # a zero stake is read again within seconds
        while (leased := signed_post(served.url, "/v1/tasks/lease", account, served.audience, lease)).status_code == 403:
            assert time.monotonic() < deadline, leased.text
            time.sleep(0.5)
        assert leased.status_code == 200 and leased.json()["run_id"] == run.json()["id"], leased.text

    # Without settlement a run cannot ask for a stake it could never check.
    with serve(CoordinatorSettings(database_url=sqlite_url, blob_dir=tmp_path / "blobs")) as served:
        body = {"name": "unstakeable", "min_stake": 1}
        refused = HTTP.post(f"{served.url}/v1/admin/runs", json=body, headers={"authorization": f"Bearer {admin_token(served)}"})
        assert refused.status_code == 422 and "min_stake needs settlement" in refused.text


def test_replicas_close_and_anchor_each_epoch_once(database_url, tmp_path, anvil, chain) -> None:
    """Two coordinators' settlement loops on one ledger, sharing the sender, racing pass for pass."""
    import threading

    settlement, admin, keystore = chain
    settings = settled(database_url, tmp_path, anvil, settlement, keystore)
    settings.chain.epoch_s = 3600
    unsettled = settings.model_copy(update={"chain": settings.chain.model_copy(update={"rpc_url": None})})
    with serve(unsettled) as served:  # lays the ledger; settles nothing itself
        run_id = make_run(served)
        for units in ("1.0", "2.0", "3.0"):
            lay_credit(served, run_id, Account.create().address, units)
        sessions = make_sessionmaker(served.engine)
        replicas = [Anchorer(sessions, settings), Anchorer(sessions, settings)]
        nonce = settlement.w3.eth.get_transaction_count(admin.address)
        for _ in range(3):
            passes = [threading.Thread(target=r.tick) for r in replicas]
            for p in passes:
                p.start()
            for p in passes:
                p.join()
        with served.engine.connect() as connection:
            from sqlalchemy import text

            assert connection.execute(text("SELECT count(*) FROM epochs")).scalar() == 1
            assert connection.execute(text("SELECT count(*) FROM epoch_anchors")).scalar() == 1
            root = connection.execute(text("SELECT root FROM epochs")).scalar()
        assert settlement.latest_epoch() == 1 and "0x" + settlement.root_at(1).hex() == root
        # At most one root transaction got through; a racing duplicate is refused by the nonce or the contract.
        posted = settlement.distributor.events.RootPosted.get_logs(from_block=0)
        assert len(posted) == 1
        assert settlement.w3.eth.get_transaction_count(admin.address) - nonce <= 2


def test_validators_stake_like_nodes_and_a_revoked_one_is_slashed_citing_what_outvoted_it(
    sqlite_url, tmp_path, anvil, chain
) -> None:
    from intellect_protocol.node.work import finish, generate
    from intellect_protocol.shared.run_schemas import AuditPolicy
    from intellect_protocol.shared.schemas import SamplingParams
    from tests.support.protocol import grant, lease, upload
    from tests.test_committee import judge_all

    settlement, admin, keystore = chain
    worker, rogue, first, second = (wallet(tmp_path, anvil)[0] for _ in range(4))
    for account in (worker, rogue, first, second):
        settlement.transact(admin, settlement.token.functions.mint(account.address, 20 * TOKEN))
    settings = settled(sqlite_url, tmp_path, anvil, settlement, keystore).model_copy(
        update={
            "dispute_window_s": 1.0,
            "validator_max_strikes": 1,
            **LIFTED,
        }
    )
    with serve(settings) as served:
        make_run(
            served,
            sampling=SamplingParams(max_tokens=4),
            prompts=1,
            samples=2,
            audit=AuditPolicy(share=1.0),
            min_stake=20 * TOKEN,
        )
        token = admin_token(served)
        for v in (rogue, first, second):
            grant(served, token, v.address, "validator")
        refused = signed_post(served.url, "/v1/validation/claim", rogue, served.audience, {"address": rogue.address, "limit": 1})
        assert refused.status_code == 403 and refused.json()["code"] == "stake_too_low", refused.text
        assert "Validating while a run asks 20 tokens" in refused.json()["message"]
        for account in (worker, rogue, first, second):
            settlement.transact(account, settlement.token.functions.approve(settlement.registry.address, 20 * TOKEN))
            settlement.transact(account, settlement.registry.functions.stake(20 * TOKEN))
        assert signed_post(served.url, "/v1/nodes/register", worker, served.audience, register_body(worker)).status_code == 200

        deadline = time.monotonic() + 15  # zero stakes are read again within seconds
        while (
            signed_post(
                served.url, "/v1/validation/claim", rogue, served.audience, {"address": rogue.address, "limit": 1}
            ).status_code
            != 200
        ):
            assert time.monotonic() < deadline
            time.sleep(0.5)
        while (
            task := signed_post(served.url, "/v1/tasks/lease", worker, served.audience, {"address": worker.address})
        ).status_code != 200:
            assert time.monotonic() < deadline, task.text
            time.sleep(0.5)
        forged = upload(served, worker, (t := lease(served, worker)), finish(generate(t)).data)
        assert judge_all(served, rogue, lambda c: "accept") == [forged]  # the only live validator looks first
        assert judge_all(served, first, lambda c: "hard") == [forged]  # the audit disagrees
        assert judge_all(served, second, lambda c: "hard") == [forged]  # the tie-break outvotes the rogue

        deadline = time.monotonic() + 30
        while settlement.registry.functions.slashed(rogue.address).call() == 0:
            assert time.monotonic() < deadline, HTTP.get(f"{served.url}/healthz").json()
            time.sleep(0.3)
        assert settlement.registry.functions.slashed(rogue.address).call() == 20 * TOKEN
        from sqlalchemy import text

        # The ledger records the slash once its transaction's receipt is read: a moment after the chain shows it.
        while not (
            slashed := _rows(served, text("SELECT submissions, role_id FROM slashings WHERE address = :a"), a=rogue.address)
        ):
            assert time.monotonic() < deadline
            time.sleep(0.3)
        ((cited, role_id),) = slashed
        assert json.loads(cited) == [forged] and role_id is not None
        for honest in (first, second):
            assert settlement.registry.functions.slashed(honest.address).call() == 0


def _rows(served, query, **params) -> list:
    with served.engine.connect() as connection:
        return list(connection.execute(query, params).all())


def test_a_pretraining_island_stakes_to_claim_and_one_convicted_by_an_audit_is_slashed_citing_it(
    sqlite_url, tmp_path, anvil, chain, example
) -> None:
    from intellect_protocol.coordinator.island_models import IslandAudit
    from intellect_protocol.shared.coordinator_client import CoordinatorClient, Refused
    from intellect_protocol.shared.island_schemas import IslandClaim
    from tests.support.lazy_island import LazyIsland
    from tests.support.protocol import grant
    from tests.test_island_audits import audited_run, auditor, origin_relay, train

    settlement, admin, keystore = chain
    liar = wallet(tmp_path, anvil)[0]
    settlement.transact(admin, settlement.token.functions.mint(liar.address, 20 * TOKEN))
    run_id = audited_run(sqlite_url, tmp_path, example, "--min-stake", "20")
    settings = settled(sqlite_url, tmp_path, anvil, settlement, keystore).model_copy(update={"dispute_window_s": 1.0})
    with serve(settings) as served:
        grant(served, admin_token(served), liar.address, "trainer")
        claim = IslandClaim(address=liar.address, run_id=run_id, island="solo")
        with pytest.raises(Refused) as caught:
            CoordinatorClient(served.url, liar).island_claim_shards(claim)
        assert caught.value.code == "stake_too_low" and "needs 20 tokens staked" in caught.value.message
        settlement.transact(liar, settlement.token.functions.approve(settlement.registry.address, 20 * TOKEN))
        settlement.transact(liar, settlement.registry.functions.stake(20 * TOKEN))
        deadline = time.monotonic() + 15  # a zero stake is read again within seconds
        while (
            signed_post(served.url, "/v1/trainer/islands/claim-shards", liar, served.audience, claim.model_dump()).status_code
            != 200
        ):
            assert time.monotonic() < deadline
            time.sleep(0.5)
        train(served, liar, run_id, LazyIsland, tmp_path)
        relay = origin_relay(served, tmp_path)
        try:
            # Two validators fail the first step: one alone never convicts.
            assert [auditor(served, tmp_path / name).audit_open(limit=1) for name in ("a", "b")] == [1, 1]
        finally:
            relay.stop()
        deadline = time.monotonic() + 30
        while settlement.registry.functions.slashed(liar.address).call() == 0:
            assert time.monotonic() < deadline, HTTP.get(f"{served.url}/healthz").json()
            time.sleep(0.3)
        from sqlalchemy import select, text

        while not (cited := _rows(served, text("SELECT submissions FROM slashings WHERE address = :a"), a=liar.address)):
            assert time.monotonic() < deadline
            time.sleep(0.3)
        with make_sessionmaker(served.engine)() as session:
            failed = session.scalar(select(IslandAudit.id).where(IslandAudit.state == "failed"))
    assert settlement.registry.functions.slashed(liar.address).call() == 20 * TOKEN
    assert json.loads(cited[0][0]) == [f"island-audit:{failed}"]
