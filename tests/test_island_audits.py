"""Audits of pretraining islands on a real coordinator (issue #47, item 4 and the hostile cases that need one): every
published step of a run drawn at rate 1 is uploaded by its island, replayed by real validators from the published
weights on the reported slots, and judged by the coordinator (one validator alone never convicts). An honest island
passes every audit; a lazy island (it claims whole shards and learns a few rows of each) and one that learns other
data than it reports fail, lose the trainer role citing the audit, owe a slash once the dispute window passes, and
their slots go back to be learnt again. Forged, unasked or repeated uploads and verdicts are refused and change
nothing."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
from eth_account import Account
from eth_account.signers.local import LocalAccount
from rich.console import Console
from sqlalchemy import func, select

from intellect_protocol.coordinator.clock import Clock, system_clock
from intellect_protocol.coordinator.db import make_sessionmaker
from intellect_protocol.coordinator.island_models import IslandAudit, IslandShare
from intellect_protocol.coordinator.models import ValidatorStrike
from intellect_protocol.coordinator.services import roles
from intellect_protocol.coordinator.services.settlement import slashes_due
from intellect_protocol.devnet.processes import Process, start_relay
from intellect_protocol.shared.coordinator_client import CoordinatorClient, Refused
from intellect_protocol.shared.island_audit_schemas import IslandAuditVerdict
from intellect_protocol.shared.island_schemas import IslandClaim
from intellect_protocol.shared.pretraining.manifest import ShardRef, load_manifest
from intellect_protocol.shared.pretraining.settings import PretrainSettings
from intellect_protocol.shared.schemas import RoleName
from intellect_protocol.shared.shardcast.weights import Weights
from intellect_protocol.shared.states import AuditState, ShareState
from intellect_protocol.shared.wallet import THROWAWAY_SCRYPT_N, create_wallet
from intellect_protocol.trainer.islands import OuterSync
from intellect_protocol.trainer.pretrain_island import PretrainIsland
from intellect_protocol.trainer.settings import TrainerSettings
from intellect_protocol.validator.island_audits import IslandAuditor
from tests.conftest import Served, admin_token, serve
from tests.helpers import HTTP, signed_post
from tests.support.clock import MovableClock
from tests.support.lazy_island import LazyIsland
from tests.support.protocol import grant
from tests.test_island_shares import refused
from tests.test_pretraining_run import create, settings

pytestmark = pytest.mark.integration


class OtherDataIsland(PretrainIsland):
    """Reports the shards it claimed, learns the next shard of the corpus in each one's place."""

    def fetch(self, ref: ShardRef) -> torch.Tensor:
        shards = self.corpus.shards
        return super().fetch(shards[(shards.index(ref) + 1) % len(shards)] if ref in shards else ref)


class ForgedStartSync(OuterSync):
    """Names a start its overlapped rounds never took: a pseudo-gradient the run never included."""

    @property
    def start_digest(self) -> str | None:
        return None if self.eager is None else "0" * 64


class ForgedStartIsland(PretrainIsland):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sync.__class__ = ForgedStartSync


def train(served: Served, key: LocalAccount, run_id: str, island_class: type[PretrainIsland], tmp_path: Path) -> None:
    """One island of trainer ``key`` learning the whole run alone."""
    from torchft._torchft import LighthouseServer

    lighthouse = LighthouseServer(bind="127.0.0.1:0", min_replicas=1, join_timeout_ms=200, heartbeat_timeout_ms=1500)
    url = "http://127.0.0.1:" + lighthouse.address().rsplit(":", 1)[1]
    island = island_class(
        served.url, key, run_id, "solo", url, tmp_path / "origin", tmp_path / "solo", TrainerSettings(threads=1)
    )
    try:
        island.run(threading.Event())
    finally:
        island.close()
        lighthouse.shutdown()


def audited_run(database_url: str, tmp_path: Path, example: Path, *extra: str) -> str:
    """A pretraining run of the example corpus whose every step is drawn for audit, a lone pass deciding it (unless
    ``extra`` says otherwise); its id."""
    flags = ["--sync-every", "4", "--min-islands", "1", "--batch-rows", "8", "--island-audit-rate", "1"]
    flags += ["--island-audit-second-opinion", "0", *extra]
    code, out = create(database_url, tmp_path / "blobs", example, *flags)
    assert code == 0, out
    return out.strip().splitlines()[-1]


def auditor(served: Served, tmp_path: Path) -> IslandAuditor:
    """A validator's auditor, its address granted the role."""
    validator = Account.create()
    grant(served, admin_token(served), validator.address, "validator")
    api = CoordinatorClient(served.url, validator)
    return IslandAuditor(api, validator, Weights(api, tmp_path / "v" / "weights", Console()), tmp_path / "v", Console())


def origin_relay(served: Served, workdir: Path) -> Process:
    """An ``intellect-relay --origin`` serving the steps islands published under ``workdir/origin``."""
    wallet = workdir / "relay.json"
    grant(served, admin_token(served), create_wallet(wallet, "relay-pass", scrypt_n=THROWAWAY_SCRYPT_N), "relay")
    process = start_relay(workdir, "origin", wallet, "relay-pass", served.url, origin=True)
    listed(served, process)
    return process


@dataclass
class Judged:
    """A run one island learnt alone, its steps drawn for audit, and three validators: a rogue and two honest ones."""

    served: Served
    relay: Process
    trainer: LocalAccount
    rogue: IslandAuditor
    honest: list[IslandAuditor]


@contextmanager
def judged_run(
    sqlite_url: str, tmp_path: Path, example: Path, island_class: type[PretrainIsland], *flags: str, clock: Clock = system_clock
) -> Iterator[Judged]:
    run_id = audited_run(sqlite_url, tmp_path, example, *flags)
    with serve(settings(sqlite_url, tmp_path / "blobs"), clock=clock) as served:
        trainer = Account.create()
        grant(served, admin_token(served), trainer.address, "trainer")
        train(served, trainer, run_id, island_class, tmp_path)
        relay = origin_relay(served, tmp_path)
        try:
            honest = [auditor(served, tmp_path / name) for name in ("honest-1", "honest-2")]
            yield Judged(served, relay, trainer, auditor(served, tmp_path / "rogue"), honest)
        finally:
            relay.stop()


def listed(served: Served, relay: Process) -> None:
    """Wait until the coordinator lists ``relay`` (after it starts, or after its clock jumped past its heartbeat)."""
    deadline = time.monotonic() + 20
    while relay.url not in [r["url"] for r in HTTP.get(f"{served.url}/v1/relays").json()]:
        assert time.monotonic() < deadline and relay.popen.poll() is None, relay.tail()
        time.sleep(0.05)


@pytest.mark.parametrize(
    "liar, overlap",
    [(None, False), (None, True), (LazyIsland, False), (LazyIsland, True), (OtherDataIsland, False)],
    ids=["honest", "honest-overlapped", "lazy", "lazy-overlapped", "other-data"],
)
def test_validators_replay_drawn_steps_and_a_lying_island_is_caught(
    sqlite_url: str, tmp_path: Path, example: Path, liar: type[PretrainIsland] | None, overlap: bool
) -> None:
    """Overlapped, each round starts from the agreed weights a step older: validators replay it from those."""
    run_id = audited_run(sqlite_url, tmp_path, example, *(["--overlap"] if overlap else []))
    with serve(settings(sqlite_url, tmp_path / "blobs")) as served:
        trainer = Account.create()
        grant(served, admin_token(served), trainer.address, "trainer")
        train(served, trainer, run_id, liar or PretrainIsland, tmp_path)
        relay = origin_relay(served, tmp_path)  # the published steps audits start from, through shardcast
        try:
            sessions = make_sessionmaker(served.engine)
            with sessions() as session:
                drawn = session.scalars(select(IslandAudit).where(IslandAudit.run_id == run_id).order_by(IslandAudit.id)).all()
                consumed_before = session.scalar(select(func.count()).where(IslandShare.state == ShareState.consumed))
            # Every step was drawn and uploaded by the island: its digest is what the islands vouched for.
            assert drawn and {a.state for a in drawn} == {AuditState.open}
            checker, second = auditor(served, tmp_path / "first"), auditor(served, tmp_path / "second")
            api, validator = checker.api, checker.account
            assert refused(403, lambda: CoordinatorClient(served.url, trainer).island_audits(), served)
            # An honest island's every step is replayed and passed by one validator. One validator failing a liar's
            # steps convicts nobody; a second's failing verdict on its first convicts it, and its other audits are moot.
            assert checker.audit_open(limit=50) == len(drawn)
            with sessions() as session:
                waiting = set(session.scalars(select(IslandAudit.state).where(IslandAudit.run_id == run_id)))
                kept_role = roles.active(session, trainer.address, RoleName.trainer) is not None
            assert (waiting, kept_role) == ({AuditState.open if liar else AuditState.passed}, True)
            assert second.audit_open(limit=50) == (1 if liar else 0)
            public = HTTP.get(f"{served.url}/v1/public/runs/{run_id}/islands").json()
            with sessions() as session:
                states = list(
                    session.scalars(select(IslandAudit.state).where(IslandAudit.run_id == run_id).order_by(IslandAudit.id))
                )
                consumed_after = session.scalar(select(func.count()).where(IslandShare.state == ShareState.consumed))
                due = slashes_due(session, datetime.now(UTC) + timedelta(days=30), window_s=3600)
            trainer_api = CoordinatorClient(served.url, trainer)
            # Nothing forged, unasked or repeated changes a decided audit.
            assert "takes no verdict" in refused(409, lambda: api.island_audit_verdict(drawn[0].id, _verdict(validator)), served)
            assert "No island audit" in refused(404, lambda: api.island_audit_verdict(10**6, _verdict(validator)), served)
            assert "validator role" in refused(
                403, lambda: trainer_api.island_audit_verdict(drawn[0].id, _verdict(trainer)), served
            )
            assert "trainer role" in refused(403, lambda: api.upload_pseudo_gradient(run_id, b"\x00" * 64), served)
            # A lie in each field a caller declares: the address a verdict names, the run an upload is for.
            before = served.snapshot()
            lied = signed_post(
                served.url,
                f"/v1/validation/island-audits/{drawn[-1].id}/verdict",
                validator,
                served.audience,
                {"address": trainer.address, "relative_error": 0.0, "cosine": 1.0},
            )
            assert lied.status_code in (401, 403) and served.snapshot() == before, lied.text
            if liar is None:
                for run in (run_id, "run-none"):
                    assert "No audit" in refused(
                        404, lambda run=run: trainer_api.upload_pseudo_gradient(run, b"\x00" * 64), served
                    )
            else:
                claim = IslandClaim(address=trainer.address, run_id=run_id, island="solo")
                revoked = refused(403, lambda: trainer_api.island_claim_shards(claim), served)
        finally:
            relay.stop()
    if liar is None:
        assert states == [AuditState.passed] * len(drawn) and consumed_before == len(load_manifest(example / "corpus").shards)
        assert consumed_after == consumed_before
        assert public[0]["last_exclusion"] is None and not due
        return
    # Its first audit convicts the island: it loses the role, every slot it learnt is learnt again, and it owes a slash.
    assert states == [AuditState.failed] + [AuditState.moot] * (len(drawn) - 1), states
    assert consumed_before and consumed_after == 0
    assert "failed the audit of" in public[0]["last_exclusion"]
    assert [(d.address, d.submissions[0]) for d in due] == [(trainer.address, f"island-audit:{drawn[0].id}")]
    assert "revoked, failed the audit of island solo" in revoked


def _verdict(key: Any) -> IslandAuditVerdict:
    return IslandAuditVerdict(address=key.address, relative_error=0.0, cosine=1.0)


def test_an_overlapped_round_naming_a_start_the_run_never_included_convicts_its_island(
    sqlite_url: str, tmp_path: Path, example: Path
) -> None:
    """An overlapped round starts from the agreed weights minus the island's own last pseudo-gradient, which its
    report names: naming one the run never included is caught when the step is drawn, with no replay."""
    run_id = audited_run(sqlite_url, tmp_path, example, "--overlap")
    with serve(settings(sqlite_url, tmp_path / "blobs")) as served:
        trainer = Account.create()
        grant(served, admin_token(served), trainer.address, "trainer")
        with pytest.raises(Refused) as caught:
            train(served, trainer, run_id, ForgedStartIsland, tmp_path)
        with make_sessionmaker(served.engine)() as session:
            audits = session.scalars(select(IslandAudit).where(IslandAudit.run_id == run_id).order_by(IslandAudit.id)).all()
            consumed = session.scalar(select(func.count()).where(IslandShare.state == ShareState.consumed))
    assert caught.value.status == 403 and "never included" in caught.value.message
    assert [(a.outer_step, a.state) for a in audits] == [(0, AuditState.moot), (1, AuditState.failed)]
    assert consumed == 0


class NeverSettlesIsland(PretrainIsland):
    """Publishes its steps and never settles them, so that none is ever drawn for audit."""

    def _settle(self, *steps: int, led: bool = False) -> None:
        return None


def test_an_island_that_never_settles_cannot_publish_past_its_unsettled_step(
    sqlite_url: str, tmp_path: Path, example: Path
) -> None:
    """Settling draws a step's audits: a lone island that published and never settled would never be audited."""
    run_id = audited_run(sqlite_url, tmp_path, example)
    with serve(settings(sqlite_url, tmp_path / "blobs")) as served:
        trainer = Account.create()
        grant(served, admin_token(served), trainer.address, "trainer")
        with pytest.raises(Refused) as caught:
            train(served, trainer, run_id, NeverSettlesIsland, tmp_path)
        public = HTTP.get(f"{served.url}/v1/public/runs/{run_id}").json()
    assert caught.value.status == 409 and "Policy step 1 " in caught.value.message and "is not settled" in caught.value.message
    assert public["policy_step"] == 1


@pytest.mark.parametrize("votes", ["1", "2"])
def test_one_lying_validator_cannot_convict_an_honest_island(sqlite_url: str, tmp_path: Path, example: Path, votes: str) -> None:
    """A lone failing verdict leaves the audit open (the island keeps its role), its repeat is refused, a split waits
    for another validator, drawn by the coordinator (one not drawn can neither fetch nor judge it; one drawn that
    stays silent is replaced), and two honest replays then pass the step, with one validator or two asked for."""
    clock = MovableClock()
    with judged_run(sqlite_url, tmp_path, example, PretrainIsland, "--island-audit-votes", votes, clock=clock) as run:
        liar, honest, served = run.rogue, run.honest, run.served
        first = liar.api.island_audits(limit=1)[0]
        lie = IslandAuditVerdict(address=liar.account.address, relative_error=0.5, cosine=0.1)
        assert liar.api.island_audit_verdict(first.id, lie).state == AuditState.open
        assert "judged island audit" in refused(409, lambda: liar.api.island_audit_verdict(first.id, lie), served)
        assert [t.id for t in liar.api.island_audits(limit=50)][0] != first.id  # judged: not offered it again
        with make_sessionmaker(served.engine)() as session:
            assert roles.active(session, run.trainer.address, RoleName.trainer) is not None
        # The next verdict is drawn: the validator drawn replays it, and one not drawn cannot judge it.
        assert [t.id for t in honest[0].api.island_audits(limit=50)] == [first.id]
        fair = IslandAuditVerdict(address=honest[1].account.address, relative_error=0.0, cosine=1.0)
        assert "not drawn for" in refused(409, lambda: honest[1].api.island_audit_verdict(first.id, fair), served)
        assert "not open and drawn for" in refused(409, lambda: honest[1].api.island_audit_file(first.id), served)
        # The one drawn goes silent: once its time is up, another is drawn in its place (the liar, silent too, has
        # its audits drawn again), and on its return it is the only one left that has not judged.
        clock.advance(PretrainSettings().audit_replay_s + 1)
        listed(served, run.relay)
        assert honest[1].api.island_audits(limit=50)[0].id == first.id
        split = honest[1].audit(first)
        assert [t.id for t in honest[0].api.island_audits(limit=50)] == [first.id]
        decided = honest[0].audit(first)
        with make_sessionmaker(served.engine)() as session:
            strikes = session.execute(
                select(ValidatorStrike.validator, ValidatorStrike.island_audit_id, ValidatorStrike.submission_id)
            ).all()
    # Outvoted, the liar is struck as on a submission: enough strikes revoke its role and slash it citing the audit.
    assert [tuple(s) for s in strikes] == [(liar.account.address, first.id, None)]
    assert (split.state, split.votes) == (AuditState.open, 2)
    assert (decided.state, decided.votes) == (AuditState.passed, 3)
    assert "1 of 3 validators fail it" in (decided.outcome or "")


def test_a_validator_passing_a_lying_islands_step_is_caught_by_a_second_opinion(
    sqlite_url: str, tmp_path: Path, example: Path
) -> None:
    """A validator colluding with a lazy island passes the step it was drawn for; at ``--island-audit-second-opinion
    1`` that lone pass waits for another validator, whose failing replay splits the votes, and a third's convicts the
    island and strikes the colluder."""
    with judged_run(sqlite_url, tmp_path, example, LazyIsland, "--island-audit-second-opinion", "1") as run:
        colluder, honest = run.rogue, run.honest
        first = colluder.api.island_audits(limit=1)[0]
        cover = IslandAuditVerdict(address=colluder.account.address, relative_error=0.0, cosine=1.0)
        assert colluder.api.island_audit_verdict(first.id, cover).state == AuditState.open
        assert [t.id for t in honest[0].api.island_audits(limit=50)] == [first.id]
        split = honest[0].audit(first)
        assert [t.id for t in honest[1].api.island_audits(limit=50)] == [first.id]
        decided = honest[1].audit(first)
        with make_sessionmaker(run.served.engine)() as session:
            strikes = session.execute(select(ValidatorStrike.validator, ValidatorStrike.island_audit_id)).all()
            revoked = roles.active(session, run.trainer.address, RoleName.trainer) is None
    assert (split.state, split.votes) == (AuditState.open, 2)
    assert (decided.state, decided.votes) == (AuditState.failed, 3) and revoked
    assert [tuple(s) for s in strikes] == [(colluder.account.address, first.id)]
