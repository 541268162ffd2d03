"""Pretraining's corpus, its shipped metagenomic example and how a model is judged on it: the example is made
deterministically, every shard reads back only as the manifest names it, and one process pretraining on it
lowers the held-out loss and learns to tell the held-out species' reads apart."""

from __future__ import annotations

import hashlib
import itertools
import json
import random
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import save as save_safetensors

from intellect_protocol.shared.pretraining.corpus import load_shard, read_shard
from intellect_protocol.shared.pretraining.evaluation import auroc
from intellect_protocol.shared.pretraining.learning import batches, row_order
from intellect_protocol.shared.pretraining.manifest import (
    MAX_SHARD_BYTES,
    CorpusError,
    CorpusManifest,
    ShardRef,
    load_manifest,
    save_manifest,
)
from intellect_protocol.shared.pretraining.metagenome import make
from intellect_protocol.shared.pretraining.settings import PretrainSettings
from intellect_protocol.trainer.pretrain import pretrain
from tests.support.metagenome import SMALL


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.unit
def test_the_example_is_made_the_same_every_time_and_reads_back_as_its_manifest_says(example: Path, tmp_path: Path) -> None:
    make(tmp_path, SMALL)
    assert _files(tmp_path) == _files(example)  # shards, tokenizer, weights, report: byte for byte

    report = json.loads((example / "metagenome.json").read_text())
    manifest = load_manifest(example / "corpus")
    tokenizer_file = (example / "model" / "tokenizer.json").read_bytes()
    assert manifest.tokenizer_sha256 == hashlib.sha256(tokenizer_file).hexdigest()
    assert not json.loads(tokenizer_file).get("chat_template") and manifest.vocab_size == report["vocab_size"]
    shards = [load_shard(example / "corpus", ref, manifest) for ref in manifest.shards]
    assert sum(int((s != manifest.pad_id).sum()) for s in shards) == report["training_tokens"]
    # The reads are bases merged into k-mers: several a token on average.
    assert report["bases_per_token"] > 2
    for ref in (manifest.held_out, manifest.out_of_distribution):
        assert ref is not None
        rows = load_shard(example / "corpus", ref, manifest)
        assert rows.shape[0] == SMALL.held_out_reads and bool((rows[:, 0] == 1).all())  # one read a row, from <bos>


FORGERIES: dict[str, tuple[Callable[[], dict[str, torch.Tensor]], str]] = {
    "a second tensor": (lambda: {"tokens": torch.ones(4, 64, dtype=torch.int32), "extra": torch.zeros(1)}, "one int32 tensor"),
    "floats": (lambda: {"tokens": torch.ones(4, 64)}, "one int32 tensor"),
    "another shape": (lambda: {"tokens": torch.ones(4, 32, dtype=torch.int32)}, "not (4, 64)"),
    "an id past the vocabulary": (lambda: {"tokens": torch.full((4, 64), 10_000, dtype=torch.int32)}, "outside the vocabulary"),
    "a negative id": (lambda: {"tokens": torch.full((4, 64), -1, dtype=torch.int32)}, "outside the vocabulary"),
    "padding only": (lambda: {"tokens": torch.zeros(4, 64, dtype=torch.int32)}, "the 256 tokens the corpus says"),
}


@pytest.mark.unit
@pytest.mark.parametrize("forgery", FORGERIES, ids=list(FORGERIES))
def test_a_shard_hashed_right_but_not_as_its_manifest_says_is_refused(example: Path, forgery: str) -> None:
    manifest = load_manifest(example / "corpus")
    tensors, reason = FORGERIES[forgery]
    data = save_safetensors(tensors())
    ref = ShardRef(sha256=hashlib.sha256(data).hexdigest(), rows=4, tokens=4 * 64)
    with pytest.raises(CorpusError) as refused:
        read_shard(data, ref, manifest)
    assert ref.sha256[:12] in str(refused.value) and reason in str(refused.value)


@pytest.mark.unit
def test_a_shard_that_is_not_the_one_named_is_refused_unread(example: Path, tmp_path: Path) -> None:
    manifest = load_manifest(example / "corpus")
    ref = manifest.shards[0]
    data = (example / "corpus" / "shards" / f"{ref.sha256}.safetensors").read_bytes()
    assert torch.equal(read_shard(data, ref, manifest), load_shard(example / "corpus", ref, manifest))
    flipped = bytes([data[0] ^ 1]) + data[1:]
    with pytest.raises(CorpusError, match="another hash"):
        read_shard(flipped, ref, manifest)
    with pytest.raises(CorpusError, match="over the"):
        read_shard(b"\0" * (MAX_SHARD_BYTES + 1), ref, manifest)
    junk = b"not a safetensors file"
    with pytest.raises(CorpusError, match="not a safetensors file"):
        read_shard(junk, ref.model_copy(update={"sha256": hashlib.sha256(junk).hexdigest()}), manifest)
    with pytest.raises(CorpusError, match="missing"):
        load_shard(tmp_path, ref, manifest)


@pytest.mark.unit
def test_a_manifest_is_refused_with_its_reason(example: Path, tmp_path: Path) -> None:
    with pytest.raises(CorpusError, match="no corpus.json"):
        load_manifest(tmp_path)
    (tmp_path / "corpus.json").write_text('{"format": 2}')
    with pytest.raises(CorpusError, match="not a corpus manifest"):
        load_manifest(tmp_path)
    manifest = load_manifest(example / "corpus")
    save_manifest(tmp_path, CorpusManifest(**{**manifest.model_dump(), "shards": [manifest.held_out]}))
    with pytest.raises(CorpusError, match="names one shard twice"):
        load_manifest(tmp_path)


@pytest.mark.unit
def test_auroc_is_the_share_of_pairs_ordered_right_ties_counting_half() -> None:
    rng = random.Random(0)
    for _ in range(50):
        positives = [rng.randint(0, 9) / 2 for _ in range(rng.randint(1, 30))]
        negatives = [rng.randint(0, 9) / 2 for _ in range(rng.randint(1, 30))]
        pairs = [1.0 if p > n else 0.5 if p == n else 0.0 for p, n in itertools.product(positives, negatives)]
        assert auroc(positives, negatives) == pytest.approx(sum(pairs) / len(pairs))
    assert auroc([2.0, 3.0], [0.0, 1.0]) == 1.0 and auroc([0.0], [1.0]) == 0.0
    with pytest.raises(ValueError):
        auroc([], [1.0])


def test_pretraining_lowers_the_held_out_loss_and_tells_unseen_species_apart(example: Path) -> None:
    _, report = pretrain(example / "model", example / "corpus", PretrainSettings(epochs=4, batch_rows=8, lr=3e-3))
    before, after = report["before"], report["after"]
    assert report["tokens"] == 4 * json.loads((example / "metagenome.json").read_text())["training_tokens"]
    assert after["held_out_loss"] < before["held_out_loss"] - 0.5, report["curve"]
    assert after["ood_auroc"] > max(0.7, before["ood_auroc"] + 0.15), report["curve"]


@pytest.mark.unit
def test_the_commands_say_what_is_wrong_with_their_input_in_one_sentence(example: Path, tmp_path: Path) -> None:
    pretraining = [sys.executable, "-m", "intellect_protocol.trainer.pretrain", "--model", str(example / "model")]
    said = subprocess.run([*pretraining, "--corpus", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert said.returncode == 2 and f"{tmp_path} has no corpus.json" in said.stderr and "Traceback" not in said.stderr
    making = [sys.executable, "-m", "intellect_protocol.shared.pretraining.metagenome", "--out", str(tmp_path / "x")]
    said = subprocess.run([*making, "--species", "4", "--held-out-species", "4"], capture_output=True, text=True, timeout=120)
    assert said.returncode == 2 and "all 4 species are held out" in said.stderr and not (tmp_path / "x").exists()


@pytest.mark.unit
def test_each_epoch_reads_a_shard_in_its_own_order_that_anyone_can_replay() -> None:
    orders = [row_order(32, seed, epoch).tolist() for seed in (0, 1) for epoch in (0, 1)]
    assert all(sorted(order) == list(range(32)) for order in orders)
    assert len({tuple(order) for order in orders}) == 4  # another seed or epoch, another order
    assert row_order(32, 1, 1).tolist() == orders[3]
    rows = torch.arange(32 * 4, dtype=torch.int32).view(32, 4)
    settings = PretrainSettings(batch_rows=5)
    taken = torch.cat(list(batches(rows, settings, epoch=1)))
    assert taken.shape == (32, 4) and torch.equal(taken, rows[row_order(32, 0, 1)].long())
