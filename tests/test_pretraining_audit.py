"""An audit's judgment of a pretraining island's outer step (:mod:`shared.pretraining.audit`): the honest step, as
sent in bf16, passes its replay; a lazy island (fewer shards, or fewer rows, than it reported), one that learnt
other data, and a flipped or scaled step each fail, whatever the island says about itself."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, PreTrainedModel

from intellect_protocol.shared.pretraining.audit import TOLERANCE, judge, replay
from intellect_protocol.shared.pretraining.corpus import load_shard
from intellect_protocol.shared.pretraining.manifest import load_manifest
from intellect_protocol.shared.pretraining.settings import PretrainSettings

pytestmark = pytest.mark.unit
SETTINGS = PretrainSettings(batch_rows=8)


def _model(example: Path) -> PreTrainedModel:
    model: PreTrainedModel = AutoModelForCausalLM.from_pretrained(example / "model", local_files_only=True)
    return model


def test_an_honest_step_passes_and_every_lazy_or_lying_one_fails(example: Path) -> None:
    manifest = load_manifest(example / "corpus")
    shards = [load_shard(example / "corpus", ref, manifest) for ref in manifest.shards[:3]]
    reported = [(0, shards[0]), (0, shards[1])]  # the slots the island reports for its outer step
    model = _model(example)
    before = [p.detach().clone() for p in model.parameters()]
    replayed = replay(model, reported, manifest.pad_id, SETTINGS)
    assert all(torch.equal(a, p) for a, p in zip(before, model.parameters(), strict=True)), "the model is left as it was"

    honest = replay(_model(example), reported, manifest.pad_id, SETTINGS)
    verdict = judge(honest.to(torch.bfloat16), replayed)  # as it travels between islands
    assert verdict.passed and verdict.relative_error < TOLERANCE / 4 and verdict.cosine > 0.999, verdict

    lies = {
        "learnt one of the two shards it reported": replay(_model(example), reported[:1], manifest.pad_id, SETTINGS),
        "learnt half of each shard's rows": replay(
            _model(example), [(e, rows[: len(rows) // 2]) for e, rows in reported], manifest.pad_id, SETTINGS
        ),
        "learnt another shard": replay(_model(example), [(0, shards[0]), (0, shards[2])], manifest.pad_id, SETTINGS),
        "learnt them in another epoch's order": replay(_model(example), [(1, r) for _, r in reported], manifest.pad_id, SETTINGS),
        "flipped": -honest,
        "scaled by 1.1": 1.1 * honest,
        "not finite": torch.full_like(honest, float("nan")),
        "cut short": honest[:-1],
    }
    for what, sent in lies.items():
        verdict = judge(sent, replayed)
        assert not verdict.passed, (what, verdict)
    assert judge(-honest, replayed).cosine < -0.99
