"""The trainer's FSDP path under ``torchrun``: two CPU ranks (Gloo) take the step one process takes
on the same batch, and only rank 0 publishes it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
from eth_account import Account
from rich.console import Console
from safetensors.torch import load_file
from sqlalchemy import select

from intellect_protocol.coordinator.db import make_sessionmaker
from intellect_protocol.coordinator.models import TrainerMetrics
from intellect_protocol.coordinator.settings import CoordinatorSettings
from intellect_protocol.coordinator.shardcast_models import PolicyManifest
from intellect_protocol.node.work import finish, generate
from intellect_protocol.shared.models import load_model
from intellect_protocol.shared.run_schemas import AuditPolicy
from intellect_protocol.shared.schemas import SamplingParams
from intellect_protocol.shared.shardcast.origin import step_dir
from intellect_protocol.shared.wallet import THROWAWAY_SCRYPT_N, create_wallet, load_wallet
from intellect_protocol.trainer.distributed import Placement
from intellect_protocol.trainer.loop import Trainer
from intellect_protocol.trainer.settings import TrainerSettings
from intellect_protocol.validator.worker import Validator
from tests.conftest import LIFTED, admin_token, serve
from tests.families import FAMILIES, arithmetic_task, build
from tests.fsdp_step import grpo_step
from tests.helpers import make_run
from tests.support.protocol import grant, joined, lease, upload

pytestmark = pytest.mark.e2e

GROUPS = 2


@pytest.mark.timeout(600)
@pytest.mark.xdist_group("e2e-a")
def test_two_ranks_take_the_single_process_step_and_only_rank_0_publishes(sqlite_url: str, tmp_path: Path) -> None:
    settings = CoordinatorSettings(
        database_url=sqlite_url,
        blob_dir=tmp_path / "blobs",
        **LIFTED,
    )
    with serve(settings) as served:
        run_id = make_run(
            served,
            sampling=SamplingParams(temperature=1.0, max_tokens=48),
            prompts=2,
            samples=4,
            audit=AuditPolicy(share=0, new_node_share=0, suspect_share=0),
        )
        token = admin_token(served)
        wallet = tmp_path / "trainer.json"
        grant(served, token, create_wallet(wallet, "pw", scrypt_n=THROWAWAY_SCRYPT_N), "trainer")
        validator_key = Account.create()
        grant(served, token, validator_key.address, "validator")
        node = joined(served)
        for _ in range(8):  # 16 groups: at least 3 with reward variance (measured in tests/test_trainer.py)
            task = lease(served, node)
            upload(served, node, task, finish(generate(task)).data)
        validator = Validator(served.url, validator_key, tmp_path / "validator", Console(quiet=True), batch=8)
        assert validator.run(max_submissions=8) == 8
        validator.close()

        env = {
            **os.environ,
            "INTELLECT_WALLET_PASSWORD": "pw",
            "INTELLECT_TRAINER_GROUPS_PER_STEP": str(GROUPS),
            "OMP_NUM_THREADS": "1",
        }
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            "--",
            shutil.which("intellect-trainer"),
        ]
        command += ["run", "--wallet", str(wallet), "--run", run_id, "--coordinator", served.url, "--steps", "1"]
        command += ["--origin-dir", str(tmp_path / "origin"), "--checkpoint-dir", str(tmp_path / "ckpt")]
        ranks = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
        assert ranks.returncode == 0, ranks.stdout[-3000:] + ranks.stderr[-3000:]

        # One process, the same batch from the same cursor, the same recipe.
        alone = Trainer(
            served.url,
            load_wallet(wallet, "pw"),
            run_id,
            tmp_path / "alone",
            tmp_path / "alone-ckpt",
            TrainerSettings(groups_per_step=GROUPS),
        )
        batch = alone.collect(threading.Event())
        assert batch is not None and len(batch.groups) >= GROUPS  # whole submissions: the same batch the ranks took
        alone.train_step(batch)
        alone.close()

        sharded = load_file(step_dir(tmp_path / "origin", run_id, 1) / "model.safetensors")
        single, base = alone.model.state_dict(), load_model(alone.run_info.model)[0].state_dict()
        assert_same_update(sharded, single, base)

        with make_sessionmaker(served.engine)() as session:
            assert [(m.step, m.signer) for m in session.scalars(select(PolicyManifest))] == [(1, alone.account.address)]
            assert [m.step for m in session.scalars(select(TrainerMetrics))] == [1]  # rank 1 posted nothing
        assert ranks.stdout.count("step 1: loss") == 1, ranks.stdout


def assert_same_update(sharded: dict[str, torch.Tensor], single: dict[str, torch.Tensor], base: dict[str, torch.Tensor]) -> None:
    """The ranks' step moved every weight as one process's step did.

    Compared as updates: reduction order differs between an all-reduce and one process, and
    where a gradient is near Adam's eps the update scales with the gradient's own size, so the
    rounding shows elementwise (measured over 8 runs: up to 2 % of a tensor's update in norm,
    and no element off by half the largest update). Ranks that trained on the wrong rows or
    gathered the wrong shards flip the sign of a large share of elements (each off by up to twice it)."""
    assert set(sharded) <= set(single) and len(sharded) >= len(single) - 1  # a tied head is saved once
    for name, value in sharded.items():
        ours, theirs = value - base[name], single[name] - base[name]
        if theirs.norm() == 0:
            assert ours.norm() == 0, name
            continue
        off = (ours - theirs).abs() > 0.5 * theirs.abs().max()
        assert float(off.float().mean()) < 1e-3 and float((ours - theirs).norm() / theirs.norm()) < 0.1, name
    assert any(not torch.equal(single[n], base[n]) for n in sharded), "the step changed no weight"


@pytest.mark.timeout(600)
@pytest.mark.xdist_group("e2e-a")
def test_every_family_takes_the_single_process_step_under_fsdp(tmp_path: Path) -> None:
    """Llama, Qwen2, Qwen3, Mistral and Gemma 3 (tied and untied heads), each wrapped per decoder
    layer by the trainer's FSDP path on two Gloo ranks: the gathered weights are one process's step."""
    models = []
    for family in FAMILIES:
        model_dir = build(family, tmp_path / family)
        task = arithmetic_task(model_dir, seed=2)
        (model_dir / "rollouts.parquet").write_bytes(finish(generate(task)).data)
        models.append(model_dir)
    out = tmp_path / "sharded"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "--"]
    command += [str(Path(__file__).with_name("fsdp_step.py")), str(out), *map(str, models)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).parents[1])}
    ranks = subprocess.run(command, env=env, capture_output=True, text=True, timeout=400)
    assert ranks.returncode == 0, ranks.stdout[-3000:] + ranks.stderr[-3000:]
    # Gloo's threads were joined before the interpreter's teardown, where one of them could abort the rank.
    for rank in (0, 1):
        threads = (out / f"threads-{rank}.txt").read_text().split()
        assert threads and not [name for name in threads if "gloo" in name], threads
    for model_dir in models:
        single = grpo_step(model_dir, Placement(0, 1, torch.device("cpu"))).model.state_dict()
        base = load_model(model_dir)[0].state_dict()
        assert_same_update(load_file(out / model_dir.name / "model.safetensors"), single, base)
