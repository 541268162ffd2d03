"""A pretraining run on a real coordinator: ``run create --kind pretrain`` checks the corpus and puts its shards in
the blob store; islands claim shard slots, each shard once an epoch, fetch shards by hash, and one island learns the
whole corpus through real outer steps, publishing steps whose held-out loss falls. Nodes never get its tasks."""

from __future__ import annotations

import hashlib
import json
import threading
from pathlib import Path

import pytest
import torch
from eth_account import Account
from sqlalchemy import select
from transformers import AutoModelForCausalLM, PreTrainedModel
from typer.testing import CliRunner

from intellect_protocol.coordinator.cli import app as coordinator_cli
from intellect_protocol.coordinator.db import make_sessionmaker
from intellect_protocol.coordinator.island_models import IslandShare
from intellect_protocol.coordinator.models import TrainerMetrics
from intellect_protocol.coordinator.services.pretraining import slot
from intellect_protocol.coordinator.settings import CoordinatorSettings
from intellect_protocol.shared.coordinator_client import CoordinatorClient, Refused
from intellect_protocol.shared.island_schemas import IslandClaim, IslandJoin
from intellect_protocol.shared.pretraining.audit import judge, replay
from intellect_protocol.shared.pretraining.corpus import load_shard, shard_path
from intellect_protocol.shared.pretraining.evaluation import evaluate
from intellect_protocol.shared.pretraining.manifest import load_manifest
from intellect_protocol.shared.pretraining.settings import PretrainSettings
from intellect_protocol.shared.shardcast.origin import step_dir
from intellect_protocol.shared.states import RunKind, ShareState
from intellect_protocol.trainer.pretrain_island import PretrainIsland
from intellect_protocol.trainer.settings import TrainerSettings
from tests.conftest import LIFTED, admin_token, serve
from tests.helpers import HTTP, make_run, signed_post
from tests.support.protocol import grant, joined

pytestmark = pytest.mark.integration


def create(database_url: str, blobs: Path, example: Path, *extra: str, corpus: Path | None = None) -> tuple[int, str]:
    """``intellect-coordinator run create --kind pretrain`` on ``example``; its exit code and output."""
    args = ["run", "create", "--name", "meta", "--kind", "pretrain", "--corpus", str(corpus or example / "corpus")]
    args += ["--model", str(example / "model"), "--database-url", database_url, *extra]
    result = CliRunner().invoke(coordinator_cli, args, env={"INTELLECT_BLOB_DIR": str(blobs)})
    return result.exit_code, result.output


def settings(database_url: str, blobs: Path) -> CoordinatorSettings:
    return CoordinatorSettings(
        database_url=database_url,
        blob_dir=blobs,
        **LIFTED,
        heartbeat_interval_s=3600,
    )


def test_islands_claim_each_shard_once_an_epoch_and_nodes_get_no_tasks(database_url: str, tmp_path: Path, example: Path) -> None:
    code, out = create(database_url, tmp_path / "blobs", example, "--epochs", "2")
    assert code == 0, out
    run_id = out.strip().splitlines()[-1]
    manifest = load_manifest(example / "corpus")
    shards = len(manifest.shards)
    with serve(settings(database_url, tmp_path / "blobs")) as served:
        token = admin_token(served)
        east, west, stranger = Account.create(), Account.create(), Account.create()
        for key in (east, west):
            grant(served, token, key.address, "trainer")
        info = CoordinatorClient(served.url, east).run_info(run_id)
        assert info.kind == RunKind.pretrain and info.corpus == manifest and info.pretrain and info.pretrain.epochs == 2

        # Nodes: no task of a pretraining run, by name or by default.
        node = joined(served)
        by_name = signed_post(served.url, "/v1/tasks/lease", node, served.audience, {"address": node.address, "run_id": run_id})
        assert by_name.status_code == 404 and "pretraining run" in by_name.json()["message"]
        default = signed_post(served.url, "/v1/tasks/lease", node, served.audience, {"address": node.address})
        assert default.status_code == 204 and default.headers["x-intellect-wait"] == "no_run"

        with CoordinatorClient(served.url, east) as a, CoordinatorClient(served.url, west) as b:
            first = a.island_claim_shards(IslandClaim(address=east.address, run_id=run_id, island="east", limit=3))
            assert [s.cursor for s in first.slots] == [1, 2, 3] and first.remaining == 2 * shards
            assert [(s.epoch, s.index) for s in first.slots] == [(0, 0), (0, 1), (0, 2)]
            assert [s.shard for s in first.slots] == manifest.shards[:3]
            # Another island gets the next slots, past the first epoch into the second.
            rest = b.island_claim_shards(IslandClaim(address=west.address, run_id=run_id, island="west", limit=500))
            cursors = [s.cursor for s in rest.slots]
            assert cursors == list(range(4, 4 + len(cursors))) and cursors[-1] > shards
            second_epoch = [s for s in rest.slots if s.cursor > shards]
            assert [(s.epoch, s.index) for s in second_epoch[:2]] == [(1, 0), (1, 1)]

            # A shard comes back byte for byte; a hash outside the corpus, or a caller without the role, is refused.
            ref = manifest.shards[0]
            assert a.corpus_shard(run_id, ref.sha256) == shard_path(example / "corpus", ref).read_bytes()
            for who, sha, status in ((a, "0" * 64, 404), (CoordinatorClient(served.url, stranger), ref.sha256, 403)):
                with pytest.raises(Refused) as refused:
                    who.corpus_shard(run_id, sha)
                assert refused.value.status == status
            # RL claims on a pretraining run, and shard claims on an RL run, are refused.
            with pytest.raises(Refused) as refused:
                a.island_claim(IslandClaim(address=east.address, run_id=run_id, island="east"))
            assert refused.value.status == 409
            rl = make_run(served, name="rl")
            with pytest.raises(Refused) as refused:
                a.island_claim_shards(IslandClaim(address=east.address, run_id=rl, island="east"))
            assert refused.value.status == 409

            # Each address holds at most its fair share: half the slots, two live trainers.
            assert len(rest.slots) == shards
            # An island that rejoins gives its slots back; they are handed out first again.
            assert a.island_join(IslandJoin(address=east.address, run_id=run_id, island="east")) == 3
            again = a.island_claim_shards(IslandClaim(address=east.address, run_id=run_id, island="east", limit=2))
            assert [s.cursor for s in again.slots] == [1, 2]
            # Past the first slot no one holds (3), then past west's, in the second epoch.
            more = a.island_claim_shards(IslandClaim(address=east.address, run_id=run_id, island="east", limit=2))
            assert [s.cursor for s in more.slots] == [1, 2, 3, shards + 4]


def test_the_corpus_is_checked_before_the_run_is_made(sqlite_url: str, tmp_path: Path, example: Path) -> None:
    code, out = create(sqlite_url, tmp_path / "blobs", example, "--kind", "rl")
    assert code == 2 and "needs --corpus" in out
    forged = tmp_path / "forged"
    forged.mkdir()
    (forged / "corpus.json").write_bytes((example / "corpus" / "corpus.json").read_bytes())
    manifest = load_manifest(forged)
    for ref in manifest.every_shard():
        path = shard_path(forged, ref)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(shard_path(example / "corpus", ref).read_bytes())
    target = shard_path(forged, manifest.shards[1])
    target.write_bytes(target.read_bytes()[:-4] + b"\x00\x00\x00\x00")
    code, out = create(sqlite_url, tmp_path / "blobs", example, corpus=forged)
    assert code == 2 and "another hash" in out and manifest.shards[1].sha256[:12] in out
    assert not list((tmp_path / "blobs").rglob("*.safetensors")), "no shard is stored unless every one is sound"
    model = tmp_path / "model"
    model.mkdir()
    for f in (example / "model").iterdir():
        (model / f.name).write_bytes(f.read_bytes())
    tokenizer = json.loads((model / "tokenizer.json").read_text())
    tokenizer["added_tokens"] = tokenizer["added_tokens"][:-1]
    (model / "tokenizer.json").write_text(json.dumps(tokenizer))
    args = ["run", "create", "--name", "m", "--kind", "pretrain", "--corpus", str(example / "corpus"), "--model", str(model)]
    result = CliRunner().invoke(
        coordinator_cli, [*args, "--database-url", sqlite_url], env={"INTELLECT_BLOB_DIR": str(tmp_path / "b")}
    )
    assert result.exit_code == 2 and "not the one that made the corpus" in result.output
    assert not (tmp_path / "b").exists() or not any((tmp_path / "b").rglob("*.safetensors"))
    # An RL island waiting for accepted work with a meeting in flight could wait on nodes waiting for that step.
    rl = ["run", "create", "--name", "r", "--overlap", "--database-url", sqlite_url]
    result = CliRunner().invoke(coordinator_cli, rl, env={"INTELLECT_BLOB_DIR": str(tmp_path / "b")})
    assert result.exit_code == 2 and "overlapped outer steps are for pretraining runs" in result.output, result.output


def test_one_island_learns_the_whole_corpus_in_published_steps(sqlite_url: str, tmp_path: Path, example: Path) -> None:
    from torchft._torchft import LighthouseServer

    code, out = create(sqlite_url, tmp_path / "blobs", example, "--sync-every", "4", "--min-islands", "1", "--batch-rows", "8")
    assert code == 0, out
    run_id = out.strip().splitlines()[-1]
    manifest = load_manifest(example / "corpus")
    held_out = load_shard(example / "corpus", manifest.held_out, manifest)
    before = evaluate(AutoModelForCausalLM.from_pretrained(example / "model"), held_out, None, manifest.pad_id).held_out_loss
    lighthouse = LighthouseServer(bind="127.0.0.1:0", min_replicas=1, join_timeout_ms=200, heartbeat_timeout_ms=1500)
    try:
        with serve(settings(sqlite_url, tmp_path / "blobs")) as served:
            key = Account.create()
            grant(served, admin_token(served), key.address, "trainer")
            url = "http://127.0.0.1:" + lighthouse.address().rsplit(":", 1)[1]
            island = PretrainIsland(
                served.url, key, run_id, "solo", url, tmp_path / "origin", tmp_path / "solo", TrainerSettings(threads=1)
            )
            steps = island.run(threading.Event())
            # A cached shard that is no longer the shard is not learnt from: the island fetches it again.
            cached = tmp_path / "solo" / "shards" / f"{manifest.shards[0].sha256}.safetensors"
            cached.write_bytes(cached.read_bytes()[:-1] + b"\x01")
            assert torch.equal(island.fetch(manifest.shards[0]), load_shard(example / "corpus", manifest.shards[0], manifest))
            island.close()
            with make_sessionmaker(served.engine)() as session:
                states = list(session.scalars(select(IslandShare.state).where(IslandShare.run_id == run_id)))
                by_step = session.execute(select(IslandShare.outer_step, IslandShare.cursor).where(IslandShare.run_id == run_id))
                slots_of: dict[int, list[int]] = {}
                for outer_step, cursor in sorted((o, c) for o, c in by_step):
                    slots_of.setdefault(outer_step, []).append(cursor)
                metrics = [m.metrics for m in session.scalars(select(TrainerMetrics).order_by(TrainerMetrics.step))]
            public = HTTP.get(f"{served.url}/v1/public/runs/{run_id}").json()
            shares = HTTP.get(f"{served.url}/v1/public/runs/{run_id}/islands").json()
    finally:
        lighthouse.shutdown()
    # Every shard learnt once and consumed by a published step; each step judged on the held-out reads.
    assert states == [ShareState.consumed] * len(manifest.shards)
    assert steps == len(metrics) == public["policy_step"] >= 2
    assert sum(m["island_tokens"] for m in metrics) == sum(ref.tokens for ref in manifest.shards)
    assert [(i["name"], i["tokens"]) for i in shares] == [("solo", sum(ref.tokens for ref in manifest.shards))]
    assert all("held_out_loss" in m and "ood_auroc" in m for m in metrics)
    assert metrics[-1]["held_out_loss"] < before - 0.3, (before, metrics)
    # The island fetched every shard once and keeps exactly the bytes the corpus names.
    for path in (tmp_path / "solo" / "shards").iterdir():
        assert path.name == f"{hashlib.sha256(path.read_bytes()).hexdigest()}.safetensors"
    assert len(list((tmp_path / "solo" / "shards").iterdir())) == len(manifest.every_shard())

    # Every outer step replays from what the run published: one island, plain averaging, so what it sent is
    # policy step k's weights minus step k + 1's. An audit needs nothing the island says about itself.
    def weights(step: int) -> PreTrainedModel:
        return AutoModelForCausalLM.from_pretrained(step_dir(tmp_path / "origin", run_id, step) if step else example / "model")

    settings_ = PretrainSettings(batch_rows=8)
    for k in (0, steps - 1):
        start, end = weights(k), weights(k + 1)
        sent = torch.cat([(a - b).detach().flatten() for a, b in zip(start.parameters(), end.parameters(), strict=True)])
        learnt = [(s.epoch, load_shard(example / "corpus", s.shard, manifest)) for s in (slot(manifest, c) for c in slots_of[k])]
        verdict = judge(sent, replay(start, learnt, manifest.pad_id, settings_))
        assert verdict.passed and verdict.relative_error < 0.01, (k, verdict)
