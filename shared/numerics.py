"""How a node computed its rollouts, and how far an honest node computing that way may disagree
with a validator that recomputes them in the same dtype.

A rollout file declares its numerics (``intellect.numerics`` in the file's metadata, e.g.
``torch/bfloat16``); a file without the key is ``torch/float32``. The validator recomputes in the
declared dtype, because a dtype's rounding changes the model itself, not only its last digits:
on the shipped model, bf16 and fp32 forward passes over the same tokens disagreed by 7-10 logits
at a few positions per thousand rows, so no tolerance fit for honest bf16 work against an fp32
validator leaves a forger little room. Recomputed in its own dtype, honest work differs only
by kernel order (decode with a cache vs one prefill, batch shape, another engine or device),
measured on the shipped model (256-512 rows per temperature, 0.5-1.5, bf16 node with a cache
vs bf16 prefill at batch 1, 16 and 32):

- sampling: 20 of 86,787 tokens differed from the validator's argmax, every one at a near-tie
  (largest top-2 gap 0.0078 of the position's logit scale, max |logit| / T; 0.033 in a second
  run). The chance of such a flip at gap g fits ``exp(-g / s) / 2`` with s = 0.001 (16
  predicted, 20 seen); the tolerance uses s = 0.002, which predicts 34.
- logprobs: error grows with the token's improbability: at most 0.03 nats where |lp| < 0.1,
  0.12 below 1, 0.38 below 3 in one run, 0.95 at |lp| near 2 and 0.51 at |lp| = 0.34 in others;
  mean 0.0006. fp32 against fp32: at most 0.0002 nats, no flips. A bf16 logprob is therefore only loosely checked:
  a shift of one token's logprob by under a nat is indistinguishable from bf16 rounding (the
  trainer's two-sided ratio clipping bounds what it can do); a shift of every token is not:
  over 90 honest bf16 files the signed mean error stayed within 0.0007 nats (2.7 standard
  errors), while claiming +0.019 on every token (capped at 0) shifts a file's mean by 0.003.

A tolerance is a model of that disagreement; :mod:`validator.checks` says how it is used.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
ENGINES = ("torch", "vllm")
METADATA_KEY = "intellect.numerics"


@dataclass(frozen=True)
class Numerics:
    engine: str = "torch"
    dtype: str = "float32"

    def __str__(self) -> str:
        return f"{self.engine}/{self.dtype}"

    @classmethod
    def parse(cls, text: str) -> Numerics:
        engine, _, dtype = text.partition("/")
        if engine not in ENGINES or dtype not in DTYPES:
            raise ValueError(f"numerics {text[:40]!r} is not ENGINE/DTYPE with ENGINE in {ENGINES} and DTYPE in {tuple(DTYPES)}")
        return cls(engine, dtype)

    @classmethod
    def of(cls, model: torch.nn.Module, engine: str = "torch") -> Numerics:
        dtype = next(model.parameters()).dtype
        return cls(engine, next(name for name, d in DTYPES.items() if d == dtype))


@dataclass(frozen=True)
class Tolerance:
    """How far honest work in one dtype may be from the validator's recomputation in that dtype."""

    max_gap: float
    """Largest top-1 minus claimed score, relative to the logit scale, that numerics can explain;
    beyond it a token is not the seeded draw (a hard failure)."""
    flip_scale: float
    """s in the chance ``exp(-gap / s) / 2`` that honest numerics flip a position with this gap."""
    logprob_abs: float
    logprob_rel: float
    """A claimed logprob may differ from the recomputed one by ``abs + rel * |logprob|`` nats."""
    logprob_bias: float
    """Largest mean signed logprob difference over a row (honest errors cancel; a shift does not)."""
    nucleus_mass: float
    """How near the top-p boundary a token outside the validator's nucleus may lie."""
    outliers: int
    """Tokens per file that may lie beyond ``max_gap`` (their logprobs unchecked, their rows untrained):
    bf16 decode and prefill, at rare positions, disagree by far more than rounding elsewhere
    (one token 0.57 of the logit scale off in 20,032 honest bf16 rows; none in fp32)."""


TOLERANCES = {
    # 50x the fp32 disagreement measured; a declared fp32 node has almost no room.
    "float32": Tolerance(
        max_gap=1e-3, flip_scale=1e-5, logprob_abs=0.005, logprob_rel=0.01, logprob_bias=1e-3, nucleus_mass=1e-4, outliers=0
    ),
    # About 2x the largest bf16 disagreement measured, per quantity (the per-token logprob bound
    # only stops gross lies such as one token 89 nats off; the bias bounds catch systematic shifts).
    "bfloat16": Tolerance(
        max_gap=0.06, flip_scale=0.002, logprob_abs=0.6, logprob_rel=1.0, logprob_bias=0.0015, nucleus_mass=0.02, outliers=1
    ),
    # fp16 keeps 3 more mantissa bits than bf16: bf16's tolerance covers it.
    "float16": Tolerance(
        max_gap=0.06, flip_scale=0.002, logprob_abs=0.6, logprob_rel=1.0, logprob_bias=0.0015, nucleus_mass=0.02, outliers=1
    ),
}
