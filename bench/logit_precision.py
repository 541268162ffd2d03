"""How often a node's and a validator's seeded draws disagree, with the LM head in bf16 (today) and in fp32.

A bf16 node's tokens are checked by a validator that prefills them in bf16 with another batch size and kernel; a
token whose top two scores are closer than the two sides' logit difference can come out differently, and every
row holding such a deviation is kept out of training (validator/checks.py). Part of that difference is the
head's output rounded to bf16 (a step of 0.0625 at logits of 8-16), which an fp32 head over the same bf16
final-norm outputs would not add. This measures both on the same rows, with the roles' own code:

- the node's torch backend generates ``--rows`` rows of an environment's tasks at once (sdpa, KV cache), each
  token its seeded draw from the bf16 head, keeping the final-norm outputs its proofs commit to;
- the validator prefills the same rows 16 at a time with eager attention (``prefill_batch``), keeping its own;
- each side's logits are made from its outputs by the bf16 head and by the fp32 head, and each position is
  drawn again on both sides: a *flip* is a position whose draws differ.

The model is ``bench/gpu.py``'s random Qwen3-0.6B-shaped one (``--small``: its 2-layer one), or any local model
(``--model DIR``, e.g. the shipped ``shared/assets/tiny-reason`` on ``--environment long-sum``, whose rows are
hundreds of tokens long). Printed: flips per 1,000 positions, mean |logit difference|, and the share of rows
without a flip (the rows that would be trained), for each head; the last line is bf16 flips over fp32 flips.

    python bench/logit_precision.py [--device cuda] [--rows 64] [--tokens 64]
    python bench/logit_precision.py --model shared/assets/tiny-reason --environment long-sum --tokens 400
    python bench/logit_precision.py --device cpu --small
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
from pathlib import Path
from typing import cast

import torch

BENCH = Path(__file__).resolve().parent
try:
    import intellect_protocol.shared  # noqa: F401
except ModuleNotFoundError:  # a plain checkout, as on a GPU machine without the package's build tools
    sys.path.insert(0, str(BENCH))
    from _worktree import checkout

    sys.path.insert(0, str(checkout(BENCH.parent, Path(tempfile.mkdtemp()))))

from _gpu_model import FULL, SMALL, build_model, with_kernel  # noqa: E402
from _tasks import environment_task  # noqa: E402
from transformers import PreTrainedModel  # noqa: E402

from intellect_protocol.node.work import problems_for  # noqa: E402
from intellect_protocol.shared.environments.registry import plugin  # noqa: E402
from intellect_protocol.shared.inference import logits_of, prefill_batch  # noqa: E402
from intellect_protocol.shared.models import load_model  # noqa: E402
from intellect_protocol.shared.sampling import sampling_scores  # noqa: E402
from intellect_protocol.shared.tasks import assigned_rows  # noqa: E402
from intellect_protocol.shared.torch_backend import TorchBackend  # noqa: E402

VALIDATOR_BATCH = 16
BLOCK = 256
"""Positions drawn at a time: their noise is [positions, vocab] int64."""


@dataclasses.dataclass
class Rows:
    """Both sides' final-norm outputs for the generated positions after the first (the first's is the prompt's last
    position, which the node's proofs do not commit to), flattened, with each position's row, seed and index."""

    node: torch.Tensor
    validator: torch.Tensor
    row: torch.Tensor
    seed: torch.Tensor
    position: torch.Tensor


def generate_and_prefill(directory: Path, environment: str, rows: int, tokens: int, device: torch.device) -> Rows:
    node_model, tokenizer = load_model(directory, dtype=torch.bfloat16, device=str(device))
    node = TorchBackend(with_kernel(node_model, "sdpa"), tokenizer.eos_token_id, tokenizer.pad_token_id, threads=None)
    validator = with_kernel(load_model(directory, dtype=torch.bfloat16, device=str(device))[0], "eager")
    problems = problems_for(environment, plugin(environment).pin)
    tasks = [environment_task(environment, seed, str(directory), 1.0, tokens) for seed in range(-(-rows // 16))]
    assigned = [r for task in tasks for r in assigned_rows(task, problems, tokenizer)][:rows]
    prompts, seeds = [r.prompt_tokens for r in assigned], [r.seed for r in assigned]
    completions = node.generate(prompts, seeds, tasks[0].sampling)
    validator_states = []
    for start in range(0, rows, VALIDATOR_BATCH):
        part = slice(start, start + VALIDATOR_BATCH)
        prefilled = prefill_batch(validator, prompts[part], [c.tokens for c in completions[part]], tokenizer.pad_token_id)
        validator_states += [p.states[1:] for p in prefilled]
    lengths = [len(c.hidden) for c in completions]
    return Rows(
        node=torch.cat([c.hidden for c in completions]).to(device),
        validator=torch.cat(validator_states),
        row=torch.cat([torch.full((n,), i) for i, n in enumerate(lengths)]),
        seed=torch.cat([torch.full((n,), s, dtype=torch.int64) for s, n in zip(seeds, lengths)]).to(device),
        position=torch.cat([torch.arange(1, n + 1) for n in lengths]).to(device),
    )


def compare(head: str, model: PreTrainedModel, rows: Rows) -> dict[str, float]:
    """Flips and logit differences between the two sides' states under ``head`` ("bf16": the model's own head;
    "fp32": its weights and the states upcast)."""
    weight = cast(torch.nn.Linear, model.get_output_embeddings()).weight.float()
    flips, difference = torch.zeros(len(rows.row), dtype=torch.bool), 0.0
    with torch.inference_mode():
        for start in range(0, len(rows.row), BLOCK):
            part = slice(start, start + BLOCK)
            a, b = rows.node[part], rows.validator[part]
            if head == "bf16":
                la, lb = logits_of(model, a), logits_of(model, b)
            else:
                la, lb = a.float() @ weight.T, b.float() @ weight.T
            difference += float((la - lb).abs().mean(-1).sum())
            seeds, positions = rows.seed[part], rows.position[part]
            drawn = [sampling_scores(logits, seeds, positions, 1.0).argmax(-1) for logits in (la, lb)]
            flips[part] = (drawn[0] != drawn[1]).cpu()
    rows_flipped = torch.zeros(int(rows.row.max()) + 1, dtype=torch.bool).index_put_((rows.row,), flips, accumulate=True)
    return {
        "flips_per_1000": 1000 * float(flips.float().mean()),
        "mean_abs_logit_difference": difference / len(rows.row),
        "rows_without_flip": float((~rows_flipped).float().mean()),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="where both sides compute")
    parser.add_argument("--small", action="store_true", help="bench/gpu.py's 2-layer model instead of the Qwen3-0.6B-shaped one")
    parser.add_argument("--model", type=Path, help="a local model directory instead of bench/gpu.py's random model")
    parser.add_argument("--environment", default="arithmetic", help="whose tasks the node generates")
    parser.add_argument("--rows", type=int, default=64, help="rows the node generates at once")
    parser.add_argument("--tokens", type=int, default=64, help="most tokens a row")
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as scratch:
        directory = args.model
        if directory is None:
            directory = Path(scratch)
            build_model(SMALL if args.small else FULL, directory, device)
        rows = generate_and_prefill(directory, args.environment, args.rows, args.tokens, device)
        model = load_model(directory, dtype=torch.bfloat16, device=str(device))[0]
    figures = {head: compare(head, model, rows) for head in ("bf16", "fp32")}
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"{args.rows} rows of {args.environment}, {len(rows.row)} positions checked, on {name}: node generation (sdpa,")
    print(
        f"batch {args.rows}) against validator prefill (eager, batch {VALIDATOR_BATCH}), both bf16, "
        f"{model.config.num_hidden_layers} layers"
    )
    print(f"{'head':6s} {'flips / 1,000 positions':>24s} {'mean |logit difference|':>24s} {'rows without a flip':>20s}")
    for head, f in figures.items():
        print(f"{head:6s} {f['flips_per_1000']:24.2f} {f['mean_abs_logit_difference']:24.4f} {f['rows_without_flip']:20.1%}")
    ratio = figures["bf16"]["flips_per_1000"] / max(figures["fp32"]["flips_per_1000"], 1e-9)
    print(f"flips with the bf16 head / with the fp32 head: {ratio:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
