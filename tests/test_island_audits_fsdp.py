"""An island of two FSDP ranks in a run that audits its outer steps: its first rank gathers each included
pseudo-gradient whole, records its sha256 and uploads it when drawn, and a validator's one-process replay of the
island's inner steps passes it, as it passes an island of one rank (tests/test_island_audits.py); a lazy one is
caught by two validators' replays and loses its role. Its first rank also judges each step's held-out loss on a whole
copy of the agreed weights."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from eth_account import Account
from sqlalchemy import select

from intellect_protocol.coordinator.db import make_sessionmaker
from intellect_protocol.coordinator.island_models import IslandAudit
from intellect_protocol.coordinator.services import roles
from intellect_protocol.devnet.processes import script
from intellect_protocol.shared.models import load_model
from intellect_protocol.shared.schemas import RoleName
from intellect_protocol.shared.states import AuditState
from tests.conftest import admin_token, serve
from tests.helpers import keystore_json
from tests.support import lazy_island
from tests.support.protocol import grant
from tests.test_island_audits import audited_run, auditor, origin_relay
from tests.test_pretraining_run import settings

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("e2e-b")]  # two ranks under torchrun: 31-34 s that even the halves


@pytest.mark.parametrize("lazy", [False, True], ids=["honest", "lazy"])
def test_an_island_of_two_fsdp_ranks_is_audited_as_one_process_is(
    sqlite_url: str, tmp_path: Path, example: Path, lazy: bool
) -> None:
    from torchft._torchft import LighthouseServer

    run_id = audited_run(sqlite_url, tmp_path, example)
    with serve(settings(sqlite_url, tmp_path / "blobs")) as served:
        trainer = Account.create()
        grant(served, admin_token(served), trainer.address, "trainer")
        wallet = tmp_path / "trainer.json"
        wallet.write_text(keystore_json(trainer.key, "pw"))
        lighthouse = LighthouseServer(bind="127.0.0.1:0", min_replicas=1, join_timeout_ms=200, heartbeat_timeout_ms=1500)
        try:
            command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "--"]
            trainer_cli = [str(Path(lazy_island.__file__))] if lazy else script("intellect-trainer")
            command += [*trainer_cli, "run", "--wallet", str(wallet), "--coordinator", served.url]
            command += ["--run", run_id, "--origin-dir", str(tmp_path / "origin"), "--steps", "2", "--island", "solo"]
            command += ["--lighthouse", "http://127.0.0.1:" + lighthouse.address().rsplit(":", 1)[1]]
            command += ["--checkpoint-dir", str(tmp_path / "solo")]
            env = {**os.environ, "INTELLECT_WALLET_PASSWORD": "pw", "OMP_NUM_THREADS": "1"}
            done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
            assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
            # The publishing rank judged each step on a whole copy (a sharded model runs only on all its ranks).
            assert done.stdout.count("held-out loss") == 2, done.stdout[-2000:]
        finally:
            lighthouse.shutdown()
        sessions = make_sessionmaker(served.engine)
        with sessions() as session:
            drawn = session.scalars(select(IslandAudit).where(IslandAudit.run_id == run_id)).all()
        # Both steps drawn, each pseudo-gradient uploaded whole: as many bf16 numbers as the model has parameters.
        parameters = sum(p.numel() for p in load_model(example / "model")[0].parameters())
        assert len(drawn) == 2 and {a.state for a in drawn} == {AuditState.open}
        assert all((tmp_path / "blobs" / a.blob_key).stat().st_size == 2 * parameters for a in drawn)
        relay = origin_relay(served, tmp_path)
        try:
            assert auditor(served, tmp_path / "validator").audit_open(limit=50) == 2
            # One validator failing a lazy island's steps convicts nobody; a second's verdict on the first does.
            assert auditor(served, tmp_path / "second").audit_open(limit=50) == (1 if lazy else 0)
        finally:
            relay.stop()
        with sessions() as session:
            states = session.scalars(select(IslandAudit.state).where(IslandAudit.run_id == run_id).order_by(IslandAudit.id))
            kept_role = roles.active(session, trainer.address, RoleName.trainer) is not None
            assert list(states) == ([AuditState.failed, AuditState.moot] if lazy else [AuditState.passed] * 2)
            assert kept_role is not lazy
