"""One process pretraining a model on a whole corpus (the baseline islands are measured against).

    python -m intellect_protocol.trainer.pretrain --model DIR --corpus DIR --epochs 2 --out DIR

Its inner steps are :mod:`shared.pretraining.learning`'s; an epoch learns from every training shard of the corpus once, in the
manifest's order. The model is evaluated (:mod:`shared.pretraining.evaluation`) before the first step, every
``eval_every`` steps and after the last.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel

from intellect_protocol.shared.pretraining.corpus import load_shard
from intellect_protocol.shared.pretraining.evaluation import Evaluation, evaluate
from intellect_protocol.shared.pretraining.learning import learn_shard, optimizer_for
from intellect_protocol.shared.pretraining.manifest import CorpusError, load_manifest
from intellect_protocol.shared.pretraining.settings import PretrainSettings
from intellect_protocol.shared.tiny_model import training_bar


def pretrain(
    model_dir: Path, corpus_dir: Path, settings: PretrainSettings, eval_every: int = 0
) -> tuple[PreTrainedModel, dict[str, Any]]:
    """Pretrain ``model_dir``'s model on ``corpus_dir`` for ``settings.epochs`` in this process; the model and a report of
    its evaluations by tokens trained."""
    manifest = load_manifest(corpus_dir)
    held_out = load_shard(corpus_dir, manifest.held_out, manifest)
    ood = None if manifest.out_of_distribution is None else load_shard(corpus_dir, manifest.out_of_distribution, manifest)
    torch.manual_seed(settings.seed)
    model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True)
    optimizer = optimizer_for(model, settings)
    curve: list[dict[str, Any]] = []
    tokens = steps = 0

    def judge() -> Evaluation:
        result = evaluate(model, held_out, ood, manifest.pad_id)
        curve.append({"step": steps, "tokens": tokens, **result.model_dump()})
        return result

    before, start = judge(), time.monotonic()
    with training_bar() as progress:
        bar = progress.add_task("pretraining", total=settings.epochs * len(manifest.shards))

        def after_step(loss: float, learnt: int) -> None:
            nonlocal steps, tokens
            steps, tokens = steps + 1, tokens + learnt
            progress.update(bar, description=f"pretraining  loss {loss:.3f}  tokens {tokens}")
            if eval_every and steps % eval_every == 0:
                judge()

        for epoch in range(settings.epochs):
            for ref in manifest.shards:
                rows = load_shard(corpus_dir, ref, manifest)
                learn_shard(model, optimizer, rows, manifest.pad_id, settings, epoch, after_step)
                progress.update(bar, advance=1)
    if curve[-1]["step"] != steps:
        judge()
    report = {
        "corpus": manifest.name,
        "epochs": settings.epochs,
        "steps": steps,
        "tokens": tokens,
        "seconds": round(time.monotonic() - start, 1),
        "before": before.model_dump(),
        "after": Evaluation.model_validate(curve[-1]).model_dump(),
        "curve": curve,
    }
    return model, report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, required=True, help="model directory to start from (its weights and config)")
    parser.add_argument("--corpus", type=Path, required=True, help="corpus directory (corpus.json and shards/)")
    parser.add_argument("--eval-every", type=int, default=0, help="inner steps between evaluations (0: before and after only)")
    parser.add_argument("--out", type=Path, help="save the pretrained model here (with pretraining.json)")
    for name in ("epochs", "batch_rows", "lr", "seed"):
        field = PretrainSettings.model_fields[name]
        parser.add_argument(
            f"--{name.replace('_', '-')}", type=type(field.default), default=field.default, help=field.description
        )
    args = parser.parse_args()
    torch.set_num_threads(1)
    settings = PretrainSettings(epochs=args.epochs, batch_rows=args.batch_rows, lr=args.lr, seed=args.seed)
    try:
        model, report = pretrain(args.model, args.corpus, settings, args.eval_every)
    except (CorpusError, OSError) as e:  # a corpus or model directory that is not one: one sentence, no traceback
        parser.error(str(e))
    if args.out:
        model.save_pretrained(args.out, safe_serialization=True)
        (args.out / "pretraining.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({k: v for k, v in report.items() if k != "curve"}, indent=2))


if __name__ == "__main__":
    main()
