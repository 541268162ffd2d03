"""Two trainer islands against a real coordinator, validator and torchft lighthouse: each trains on its
own claims, they meet every ``sync_every`` inner updates, one publishes each policy step, and every group
they trained on was trained on once. Then as operators run them (``intellect-trainer run --island``): one
SIGKILLed mid-run, the other training on alone, the first restarted to recover from it, no share lost."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest
import torch
from eth_account import Account
from eth_account.signers.local import LocalAccount
from rich.console import Console
from sqlalchemy import func, select

from intellect_protocol.coordinator.db import make_sessionmaker
from intellect_protocol.coordinator.island_models import IslandShare
from intellect_protocol.coordinator.models import ContributionEntry
from intellect_protocol.coordinator.settings import CoordinatorSettings
from intellect_protocol.coordinator.shardcast_models import PolicyManifest
from intellect_protocol.devnet.processes import Process, script, spawn
from intellect_protocol.node.work import finish, generate
from intellect_protocol.shared.coordinator_client import CoordinatorClient
from intellect_protocol.shared.island_schemas import IslandStatus, OuterSettings
from intellect_protocol.shared.models import load_model
from intellect_protocol.shared.run_schemas import StepTiming
from intellect_protocol.shared.schemas import DEFAULT_MODEL, SamplingParams
from intellect_protocol.shared.shardcast.origin import step_dir
from intellect_protocol.shared.states import ShareState
from intellect_protocol.trainer.island_loop import STATE, IslandTrainer
from intellect_protocol.trainer.settings import TrainerSettings
from intellect_protocol.validator.worker import Validator
from tests.conftest import LIFTED, Served, admin_token, serve
from tests.helpers import HTTP, keystore_json, make_run
from tests.support.protocol import grant, joined, lease, upload
from tests.test_island_shares import NO_AUDIT

OUTER = OuterSettings(sync_every=2)
ISLANDS = ("east", "west")


@dataclass
class IslandNetwork:
    served: Served
    run_id: str
    keys: dict[str, LocalAccount]
    lighthouse: str
    accept: Callable[[int], None]
    """Validates that many more of the run's submissions: the islands can claim them."""


@contextmanager
def island_network(
    database_url: str, tmp_path: Path, tasks: int, min_islands: int, island_lease_s: float = 300, accepted: int | None = None
) -> Iterator[IslandNetwork]:
    """A coordinator whose run (meeting every ``OUTER.sync_every`` inner steps) holds ``tasks`` submissions of
    policy step 0, ``accepted`` of them (all by default) accepted, two island wallets granted the trainer role,
    and a lighthouse."""
    from torchft._torchft import LighthouseServer

    settings = CoordinatorSettings(
        database_url=database_url,
        blob_dir=tmp_path / "blobs",
        **LIFTED,
        backlog_floor=64,
        island_lease_s=island_lease_s,
    )
    lighthouse = LighthouseServer(bind="127.0.0.1:0", min_replicas=min_islands, join_timeout_ms=500, heartbeat_timeout_ms=1500)
    try:
        with serve(settings) as served:
            sampling = SamplingParams(temperature=1.0, max_tokens=48)
            run_id = make_run(served, sampling=sampling, samples=4, audit=NO_AUDIT, outer=OUTER, async_level=8)
            token = admin_token(served)
            keys = {name: Account.create() for name in ISLANDS}
            for key in keys.values():
                grant(served, token, key.address, "trainer")
            validator_key = Account.create()
            grant(served, token, validator_key.address, "validator")
            node = joined(served)
            for _ in range(tasks):
                task = lease(served, node)
                upload(served, node, task, finish(generate(task)).data)

            def accept(n: int) -> None:
                # A batch of n: the validator checks every review it claims.
                validator = Validator(served.url, validator_key, tmp_path / "validator", Console(quiet=True), batch=n)
                validator.run(max_submissions=n)
                validator.close()

            accept(tasks if accepted is None else accepted)
            yield IslandNetwork(served, run_id, keys, "http://127.0.0.1:" + lighthouse.address().rsplit(":", 1)[1], accept)
    finally:
        lighthouse.shutdown()


@pytest.mark.integration
def test_two_islands_train_on_their_own_shares_and_publish_agreed_steps(sqlite_url: str, tmp_path: Path) -> None:
    config = TrainerSettings(groups_per_step=2)
    trained: dict[str, list[tuple[str, str]]] = {name: [] for name in ISLANDS}
    reached: dict[str, int] = {}
    errors: list[BaseException] = []
    # 48 groups at policy step 0; the islands need 16 with a reward spread.
    with island_network(sqlite_url, tmp_path, 24, min_islands=2) as net:
        # Made one after the other: loading a model is not thread-safe in transformers.
        trainers = {
            name: IslandTrainer(
                net.served.url, key, net.run_id, name, net.lighthouse, tmp_path / "origin", tmp_path / name, config
            )
            for name, key in net.keys.items()
        }

        def island(name: str) -> None:
            trainer = trainers[name]
            step = trainer.train_step

            def recording(batch, stop=None):
                trained[name].extend(g.key for g in batch.groups)
                return step(batch, stop)

            trainer.train_step = recording
            try:
                reached[name] = trainer.run(threading.Event(), steps=2)
            except BaseException as e:  # noqa: BLE001  (re-raised by the test below)
                errors.append(e)
            finally:
                trainer.close()

        threads = [threading.Thread(target=island, args=(n,)) for n in ISLANDS]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        assert not errors, errors
        with CoordinatorClient(net.served.url) as api:
            assert api.run_info(net.run_id).policy_step == 2
            signers = {api.manifest(net.run_id, s).signed.signer for s in (1, 2)}
            islands = {i.name: i for i in api.islands(net.run_id)}
            timings = [
                StepTiming.model_validate(t) for t in HTTP.get(f"{net.served.url}/v1/public/runs/{net.run_id}/step-timing").json()
            ]

    assert reached == {"east": 2, "west": 2}
    everything = trained["east"] + trained["west"]
    assert len(everything) == len(set(everything)), "a group was trained on twice"
    assert len(everything) >= 2 * 2 * OUTER.sync_every * config.groups_per_step  # islands x steps x inner updates x groups
    assert signers <= {k.address for k in net.keys.values()}
    assert set(islands) == set(ISLANDS) and all(i.outer_step == 1 for i in islands.values())
    # Every share a published step averaged is consumed; none is left waiting in a step.
    assert all(i.consumed > 0 and i.pending == 0 for i in islands.values())
    # Each step's timing reads where its shares came from, as a lone trainer's cursor tells it.
    assert [t.step for t in timings] == [1, 2] and all(t.training_s >= 0 and t.interval_s > 0 for t in timings)


@pytest.mark.integration
@pytest.mark.early  # a minute, half of it waiting out an island lease: started first, the rest runs beside it
def test_an_island_killed_mid_run_rejoins_from_its_peer_and_no_share_is_lost(sqlite_url: str, tmp_path: Path) -> None:
    steps = 6
    # Every group is trained on (no online filter), two a task, four an island's outer step; the submissions are
    # accepted in three parts so that no island can run ahead of the test, whatever the load: each meeting needs
    # both live islands (torchft refuses a quorum of half the live islands or fewer), and each island data for it.
    # A killed island counts as live for the island lease (30 s, past an inner step's silence under load): the
    # survivor publishes alone once it runs out.
    with island_network(sqlite_url, tmp_path, 26, min_islands=1, island_lease_s=30, accepted=0) as net:
        env = {
            "INTELLECT_WALLET_PASSWORD": "pw",
            "INTELLECT_TRAINER_GROUPS_PER_STEP": "2",
            "INTELLECT_TRAINER_ONLINE_FILTER": "false",
        }

        def start(name: str) -> Process:
            wallet = tmp_path / f"{name}.json"
            if not wallet.exists():
                wallet.write_text(keystore_json(net.keys[name].key, "pw"))
            command = [*script("intellect-trainer"), "run", "--wallet", str(wallet), "--coordinator", net.served.url]
            command += ["--run", net.run_id, "--origin-dir", str(tmp_path / "origin"), "--steps", str(steps)]
            command += ["--island", name, "--lighthouse", net.lighthouse, "--checkpoint-dir", str(tmp_path / name)]
            return spawn(name, command, tmp_path / f"{name}.log", env)

        east, west = start("east"), start("west")
        api = CoordinatorClient(net.served.url)

        def island(name: str) -> IslandStatus | None:
            return next((i for i in api.islands(net.run_id) if i.name == name), None)

        def until(done: Callable[[], object], *running: Process) -> None:
            deadline = time.monotonic() + 120
            while not done():
                assert time.monotonic() < deadline and all(p.popen.poll() is None for p in running), "".join(
                    p.tail() for p in running
                )
                time.sleep(0.05)

        try:
            until(lambda: all(island(n) is not None for n in ISLANDS), east, west)
            net.accept(8)  # two meetings of both at most, and enough for west to report its share of the second
            until(lambda: (w := island("west")) is not None and w.outer_step >= 1, east, west)  # west took part
            west.kill()
            killed_time, killed_at = datetime.now(UTC), api.run_info(net.run_id).policy_step
            reported_before = next(i.outer_step for i in api.islands(net.run_id) if i.name == "west")
            net.accept(2)  # with what west held, two steps of east alone at most: the run stays short of its last
            until(lambda: api.run_info(net.run_id).policy_step > killed_at, east)  # east trains on alone
            west.restart()
            until(lambda: (w := island("west")) is not None and w.joined_at > killed_time, east, west)
            joined = datetime.now(UTC)
            net.accept(16)  # west waits for east at the lighthouse, recovers its weights, and both train to the end
            assert east.popen.wait(180) == 0, east.tail()
            assert west.popen.wait(180) == 0, west.tail()
            islands = {i.name: i for i in api.islands(net.run_id)}
            assert api.run_info(net.run_id).policy_step == steps
        finally:
            api.close()
            for p in (east, west):
                p.stop()
        with make_sessionmaker(net.served.engine)() as session:
            states = dict(session.execute(select(IslandShare.state, func.count()).group_by(IslandShare.state)).all())
            alone = session.scalar(
                select(func.count())
                .select_from(PolicyManifest)
                .where(PolicyManifest.created_at > killed_time, PolicyManifest.created_at < joined)
            )
            accepted = session.scalar(
                select(func.count()).select_from(ContributionEntry).where(ContributionEntry.kind == "credit")
            )

    # Nothing waits in a step, and every accepted submission is trained on, held by an island, or in the pool.
    assert states.get(ShareState.pending, 0) == 0
    assert sum(i.consumed for i in islands.values()) == states[ShareState.consumed] <= accepted
    assert islands["west"].consumed > 0 and islands["east"].consumed > 0
    # East published steps while west was down; west joined again, recovered the agreed weights, and took part
    # again (in every later step but where its claims went back meanwhile, which the log says): both islands end
    # on the very same weights.
    west_log = (tmp_path / "west.log").read_text().splitlines()
    west_said = [line for line in west_log if "stays out" in line]
    assert alone >= 1 and reported_before < islands["west"].outer_step, west_said
    assert islands["west"].outer_step == steps - 1 or west_said, "\n".join(west_log[-40:])
    east_state, west_state = (torch.load(tmp_path / name / STATE, weights_only=True) for name in ISLANDS)
    assert east_state["step"] == west_state["step"] == steps
    assert all(torch.equal(e, w) for e, w in zip(east_state["outer"]["agreed"], west_state["outer"]["agreed"], strict=True))
    # Over Gloo, torchft's notice about NCCL's flight recorder at every meeting is noise: none reaches the logs.
    assert not any("flight recorder" in (tmp_path / f"{name}.log").read_text() for name in ISLANDS)


@pytest.mark.e2e
@pytest.mark.xdist_group(
    "e2e-a"
)  # four trainer processes under torchrun: beside the devnet, away from chaos and the chain devnet
def test_islands_of_two_fsdp_ranks_train_and_publish_through_the_cli(sqlite_url: str, tmp_path: Path) -> None:
    with island_network(sqlite_url, tmp_path, 24, min_islands=2) as net:
        env = {**os.environ, "INTELLECT_WALLET_PASSWORD": "pw", "INTELLECT_TRAINER_GROUPS_PER_STEP": "2", "OMP_NUM_THREADS": "1"}
        runs = []
        for name, key in net.keys.items():
            wallet = tmp_path / f"{name}.json"
            wallet.write_text(keystore_json(key.key, "pw"))
            command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "--"]
            command += [*script("intellect-trainer"), "run", "--wallet", str(wallet), "--coordinator", net.served.url]
            command += ["--run", net.run_id, "--origin-dir", str(tmp_path / "origin"), "--steps", "1"]
            command += ["--island", name, "--lighthouse", net.lighthouse, "--checkpoint-dir", str(tmp_path / name)]
            runs.append(subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        outputs = [r.communicate(timeout=300)[0] for r in runs]
        assert [r.returncode for r in runs] == [0, 0], "\n".join(o[-3000:] for o in outputs)
        with CoordinatorClient(net.served.url) as api:
            assert api.run_info(net.run_id).policy_step == 1
            islands = api.islands(net.run_id)
    assert all(i.consumed > 0 and i.pending == 0 for i in islands)
    # The publishing rank gathered every rank's shard: the step is the whole model.
    published, _ = load_model(step_dir(tmp_path / "origin", net.run_id, 1))
    assert sum(p.numel() for p in published.parameters()) == sum(p.numel() for p in load_model(DEFAULT_MODEL)[0].parameters())
    # Each rank kept its own shard of the island's state.
    assert all((tmp_path / name / f"island-state-{rank}.pt").exists() for name in ISLANDS for rank in (0, 1))
