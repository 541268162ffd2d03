"""How often a node's and a validator's seeded draws disagree, with the LM head in bf16 (today) and in fp32.

A bf16 node's tokens are checked by a validator that prefills them in bf16 with another batch size and kernel; a
token whose top two scores are closer than the two sides' logit difference can come out differently, and every
row holding such a deviation is kept out of training (validator/checks.py). Part of that difference is the
head's output rounded to bf16 (a step of 0.0625 at logits of 8-16), which an fp32 head over the same bf16
final-norm outputs would not add. This measures both on the same rows:

- the node decodes ``--rows`` rows at once (sdpa, KV cache), drawing each token with the protocol's seeded
  noise from its bf16 head, and keeps its final-norm outputs;
- the validator prefills the same rows 16 at a time with eager attention and keeps its own;
- each side's logits are made from its outputs by the bf16 head and by the fp32 head, and each position is
  drawn again on both sides: a *flip* is a position whose draws differ.

Printed: flips per 1,000 positions, mean |logit difference|, and the share of rows without a flip (the rows
that would be trained), for each head; the last line is bf16 flips over fp32 flips.

    python bench/logit_precision.py [--device cuda] [--rows 64] [--tokens 64]
    python bench/logit_precision.py --device cpu --small
"""

from __future__ import annotations

import argparse
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
from transformers import DynamicCache, PreTrainedModel  # noqa: E402

from intellect_protocol.shared.inference import logits_of  # noqa: E402
from intellect_protocol.shared.models import final_norm_outputs, load_model  # noqa: E402
from intellect_protocol.shared.sampling import sampling_scores  # noqa: E402

PROMPT_TOKENS = 16
VALIDATOR_BATCH = 16
BLOCK = 256
"""Positions drawn at a time: their noise is [positions, vocab] int64."""


def decode(model: torch.nn.Module, prompts: torch.Tensor, tokens: int, seeds: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The node: ``tokens`` seeded draws at temperature 1 for every row at once; (tokens [rows, tokens], final-norm
    outputs [rows, tokens, hidden]) where output t is the one token t was drawn from."""
    cache, chosen, states = DynamicCache(), [], []
    ids = prompts
    with torch.inference_mode(), final_norm_outputs(model) as captured:
        for t in range(tokens):
            captured.clear()
            model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
            state = captured[-1][:, -1]
            logits = logits_of(model, state)
            ids = sampling_scores(logits, seeds, torch.full_like(seeds, t), 1.0).argmax(-1)[:, None]
            chosen.append(ids)
            states.append(state)
    return torch.cat(chosen, 1), torch.stack(states, 1)


def prefill(model: torch.nn.Module, prompts: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """The validator: final-norm outputs [rows, tokens, hidden] of the rows, prefilled :data:`VALIDATOR_BATCH` at a time."""
    sequences = torch.cat([prompts, tokens[:, :-1]], 1)
    out = []
    with torch.inference_mode(), final_norm_outputs(model) as captured:
        for start in range(0, len(sequences), VALIDATOR_BATCH):
            captured.clear()
            model(input_ids=sequences[start : start + VALIDATOR_BATCH], logits_to_keep=1)
            out.append(captured[-1][:, prompts.shape[1] - 1 :])
    return torch.cat(out)


def compare(
    head: str, model: PreTrainedModel, node: torch.Tensor, validator: torch.Tensor, seeds: torch.Tensor
) -> dict[str, float]:
    """Flips and logit differences between the two sides' states under ``head`` ("bf16": the model's own head;
    "fp32": its weights and the states upcast)."""
    rows, tokens, _ = node.shape
    weight = cast(torch.nn.Linear, model.get_output_embeddings()).weight.float()
    flips, difference = torch.zeros(rows, tokens, dtype=torch.bool), 0.0
    positions = torch.arange(tokens, device=node.device).repeat(rows)
    row_seeds = seeds.repeat_interleave(tokens)
    a, b = node.reshape(rows * tokens, -1), validator.reshape(rows * tokens, -1)
    with torch.inference_mode():
        for start in range(0, rows * tokens, BLOCK):
            part = slice(start, start + BLOCK)
            if head == "bf16":
                la, lb = logits_of(model, a[part]), logits_of(model, b[part])
            else:
                la, lb = a[part].float() @ weight.T, b[part].float() @ weight.T
            difference += float((la - lb).abs().mean(-1).sum())
            da = sampling_scores(la, row_seeds[part], positions[part], 1.0).argmax(-1)
            db = sampling_scores(lb, row_seeds[part], positions[part], 1.0).argmax(-1)
            flips.view(-1)[part] = (da != db).cpu()
    return {
        "flips_per_1000": 1000 * float(flips.float().mean()),
        "mean_abs_logit_difference": difference / (rows * tokens),
        "rows_without_flip": float((~flips.any(1)).float().mean()),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="where both sides compute")
    parser.add_argument("--small", action="store_true", help="bench/gpu.py's 2-layer model instead of the Qwen3-0.6B-shaped one")
    parser.add_argument("--rows", type=int, default=64, help="rows the node decodes at once")
    parser.add_argument("--tokens", type=int, default=64, help="tokens drawn per row")
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(1)
    plan = SMALL if args.small else FULL
    with tempfile.TemporaryDirectory() as directory:
        build_model(plan, Path(directory), device)
        node = with_kernel(load_model(Path(directory), dtype=torch.bfloat16, device=str(device))[0], "sdpa")
        validator = with_kernel(load_model(Path(directory), dtype=torch.bfloat16, device=str(device))[0], "eager")
        vocab_in_use = len(load_model(Path(directory), device="cpu")[1])
    generator = torch.Generator().manual_seed(0)
    prompts = torch.randint(0, vocab_in_use, (args.rows, PROMPT_TOKENS), generator=generator).to(device)
    seeds = torch.randint(0, 2**62, (args.rows,), generator=generator).to(device)
    tokens, node_states = decode(node, prompts, args.tokens, seeds)
    validator_states = prefill(validator, prompts, tokens)
    figures = {head: compare(head, validator, node_states, validator_states, seeds) for head in ("bf16", "fp32")}
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"{args.rows} rows x {args.tokens} tokens on {name}: node decode (sdpa, batch {args.rows}) against validator")
    print(f"prefill (eager, batch {VALIDATOR_BATCH}), both bf16, {plan.layers} layers")
    print(f"{'head':6s} {'flips / 1,000 positions':>24s} {'mean |logit difference|':>24s} {'rows without a flip':>20s}")
    for head, f in figures.items():
        print(f"{head:6s} {f['flips_per_1000']:24.2f} {f['mean_abs_logit_difference']:24.4f} {f['rows_without_flip']:20.1%}")
    ratio = figures["bf16"]["flips_per_1000"] / max(figures["fp32"]["flips_per_1000"], 1e-9)
    print(f"flips with the bf16 head / with the fp32 head: {ratio:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
