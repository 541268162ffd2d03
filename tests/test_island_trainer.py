"""Two trainer islands against a real coordinator, validator, shardcast origin and torchft lighthouse:
each trains on its own claims, they meet every ``sync_every`` inner updates, one publishes each policy
step, and every group they trained on was trained on once."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from eth_account import Account
from rich.console import Console

from intellect_protocol.coordinator.settings import CoordinatorSettings
from intellect_protocol.devnet.processes import start_relay
from intellect_protocol.node.work import finish, generate
from intellect_protocol.shared.coordinator_client import CoordinatorClient
from intellect_protocol.shared.island_schemas import OuterSettings
from intellect_protocol.shared.schemas import SamplingParams
from intellect_protocol.shared.wallet import create_wallet
from intellect_protocol.trainer.island_loop import IslandTrainer
from intellect_protocol.trainer.settings import TrainerSettings
from intellect_protocol.validator.worker import Validator
from tests.conftest import admin_token, serve
from tests.helpers import make_run
from tests.test_island_shares import NO_AUDIT
from tests.test_validation import grant, joined, lease, upload

pytestmark = pytest.mark.integration


def test_two_islands_train_on_their_own_shares_and_publish_agreed_steps(sqlite_url: str, tmp_path: Path) -> None:
    from torchft._torchft import LighthouseServer

    settings = CoordinatorSettings(
        database_url=sqlite_url, blob_dir=tmp_path / "blobs", rate_limit_per_s=1000, rate_limit_burst=1000, backlog_floor=32
    )
    lighthouse = LighthouseServer(bind="127.0.0.1:0", min_replicas=2, join_timeout_ms=500)
    address = "http://127.0.0.1:" + lighthouse.address().rsplit(":", 1)[1]
    with serve(settings) as served:
        outer = OuterSettings(sync_every=2)
        run_id = make_run(served, sampling=SamplingParams(temperature=1.0, max_tokens=48), samples=4, audit=NO_AUDIT, outer=outer)
        token = admin_token(served)
        keys = {"east": Account.create(), "west": Account.create()}
        for key in keys.values():
            grant(served, token, key.address, "trainer")
        validator_key = Account.create()
        grant(served, token, validator_key.address, "validator")
        grant(served, token, create_wallet(tmp_path / "origin.json", "pw"), "relay")
        origin = start_relay(tmp_path, "origin", tmp_path / "origin.json", "pw", served.url, origin=True)
        try:
            node = joined(served)
            for _ in range(24):  # 48 groups at policy step 0; the islands need 16 with a reward spread
                task = lease(served, node)
                upload(served, node, task, finish(generate(task)).data)
            validator = Validator(served.url, validator_key, tmp_path / "validator", Console(quiet=True), batch=16)
            validator.run(max_submissions=24)
            validator.close()

            config = TrainerSettings(groups_per_step=2, chunk_size=1 << 20)
            trained: dict[str, list[tuple[str, str]]] = {"east": [], "west": []}
            reached: dict[str, int] = {}
            errors: list[BaseException] = []

            # Made one after the other: loading a model is not thread-safe in transformers.
            trainers = {
                name: IslandTrainer(served.url, key, run_id, name, address, tmp_path / "origin", tmp_path / name, config)
                for name, key in keys.items()
            }

            def island(name: str) -> None:
                trainer = trainers[name]
                step = trainer.train_step

                def recording(batch, stop=None):  # type: ignore[no-untyped-def]
                    trained[name].extend(g.key for g in batch.groups)
                    return step(batch, stop)

                trainer.train_step = recording  # type: ignore[method-assign]
                try:
                    reached[name] = trainer.run(threading.Event(), steps=2)
                except BaseException as e:  # noqa: BLE001  (re-raised by the test below)
                    errors.append(e)
                finally:
                    trainer.close()

            threads = [threading.Thread(target=island, args=(n,)) for n in keys]
            for t in threads:
                t.start()
            for t in threads:
                t.join(300)
            assert not errors, errors
        finally:
            origin.stop()
            lighthouse.shutdown()

        assert reached == {"east": 2, "west": 2}
        everything = trained["east"] + trained["west"]
        assert len(everything) == len(set(everything)), "a group was trained on twice"
        assert len(everything) >= 2 * 2 * outer.sync_every * config.groups_per_step  # islands x steps x inner updates x groups
        with CoordinatorClient(served.url) as api:
            assert api.run_info(run_id).policy_step == 2
            signers = {api.manifest(run_id, s).signed.signer for s in (1, 2)}  # type: ignore[union-attr]
            islands = {i.name: i for i in api.islands(run_id)}
        assert signers <= {k.address for k in keys.values()}
        assert set(islands) == {"east", "west"} and all(i.outer_step == 1 for i in islands.values())
        # Every share a published step averaged is consumed; none is left waiting in a step.
        assert all(i.consumed > 0 and i.pending == 0 for i in islands.values())
