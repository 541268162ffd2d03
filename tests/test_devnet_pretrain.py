"""`intellect-devnet --pretrain`, as a newcomer runs it: two trainer islands pretrain the shipped METAGENE-shaped
example from scratch through a real coordinator, lighthouse and shardcast origin, and stop by themselves once
every shard is learnt twice; the held-out loss falls, every shard of every epoch was learnt exactly once, and a
validator replayed the steps drawn for audit and passed them."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from intellect_protocol.devnet.pretraining import EPOCHS
from intellect_protocol.shared.pretraining.manifest import load_manifest

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("e2e-b")]


@pytest.mark.timeout(600)
def test_the_pretraining_devnet_learns_the_corpus_and_stops(tmp_path: Path) -> None:
    workdir = tmp_path / "devnet"
    result = subprocess.run(
        ["intellect-devnet", "--pretrain", "--workdir", str(workdir)], capture_output=True, text=True, timeout=540
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = json.loads((workdir / "summary.json").read_text())
    unclean = {name: (workdir / "logs" / f"{name}.log").read_text()[-2000:] for name, c in summary["exit_codes"].items() if c}
    assert not unclean, (summary["exit_codes"], unclean, result.stdout[-2000:])
    manifest = load_manifest(workdir / "metagenome" / "corpus")
    islands = summary["islands"]
    assert sorted(i["name"] for i in islands) == ["island-0", "island-1"]
    # Each shard once an epoch, all consumed by published steps, the tokens counted from what was consumed.
    assert sum(i["consumed"] for i in islands) == EPOCHS * len(manifest.shards)
    assert all(i["claimed"] == i["pending"] == 0 for i in islands)
    assert summary["tokens_trained"] == EPOCHS * sum(ref.tokens for ref in manifest.shards)
    assert all(i["consumed"] > 0 for i in islands), "both islands learnt"
    # The loss falls, and reads of species kept out of the corpus become the less likely ones.
    before, after = summary["held_out_before"], summary["held_out_after"]
    assert after["held_out_loss"] < before["held_out_loss"] - 0.5, (before, after)
    assert after["ood_auroc"] > max(0.55, before["ood_auroc"] + 0.1), (before, after)
    assert summary["policy_step"] == max(map(int, summary["held_out_by_step"])) >= 2
    # The validator replayed every outer step the run drew for audit (half of them here), and each was honest.
    audits = summary["audits"]
    assert audits["passed"] > 0 and audits["failed"] == audits["open"] == audits["awaiting_upload"] == 0, audits
    assert "Held-out loss" in result.stdout
