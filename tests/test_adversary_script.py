"""The devnet's adversary script against a real coordinator: it cheats until it is banned, and an
upload that finds its lease gone (a ban landing mid-upload ends the node's leases at once) sends it
back to lease, not out with a crash that would stop the whole devnet."""

from __future__ import annotations

from pathlib import Path

import pytest
from eth_account import Account
from sqlalchemy import select

from intellect_protocol.coordinator.db import make_sessionmaker
from intellect_protocol.coordinator.models import Submission
from intellect_protocol.coordinator.settings import CoordinatorSettings
from intellect_protocol.devnet.adversary import cheat
from intellect_protocol.node.client import NodeClient
from intellect_protocol.node.hardware import probe
from intellect_protocol.node.settings import NodeSettings
from intellect_protocol.node.work import finish, generate
from intellect_protocol.shared.schemas import TaskSpec
from tests.conftest import admin_token, serve
from tests.helpers import HTTP, make_run


def test_a_lease_gone_mid_upload_sends_the_adversary_back_to_lease_until_its_ban(
    sqlite_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with serve(CoordinatorSettings(database_url=sqlite_url, blob_dir=tmp_path / "blobs")) as served:
        make_run(served)
        account = Account.create()
        client = NodeClient(served.url, account, NodeSettings(state_dir=tmp_path / "node"))
        client.public_status()
        client.register(probe(tmp_path / "node"), None)
        auth = {"authorization": f"Bearer {admin_token(served, 'operate')}"}
        leased: list[str] = []

        def forged(task: TaskSpec) -> bytes:
            """The first lease is taken back while the file is made; the node is banned while it makes the second."""
            leased.append(task.task_id)
            data = finish(generate(task)).data
            if len(leased) == 1:
                taken = HTTP.post(f"{served.url}/v1/admin/tasks/{task.task_id}/requeue", headers=auth)
            else:
                taken = HTTP.post(
                    f"{served.url}/v1/admin/nodes/{account.address}/ban", json={"reason": "forged proofs"}, headers=auth
                )
            assert taken.status_code == 200, taken.text
            return data

        cheat(client, forged)
        with make_sessionmaker(served.engine)() as session:
            recorded = session.scalars(select(Submission)).all()
    printed = capsys.readouterr().out
    assert len(leased) == 2 and recorded == [], (leased, recorded)
    assert "uploaded" not in printed and "stopped: " in printed and "forged proofs" in printed, printed
