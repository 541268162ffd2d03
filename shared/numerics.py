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

A tolerance (:mod:`shared.tolerances`) is a model of that disagreement; :mod:`validator.checks` says how it is used.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from intellect_protocol.shared.tolerances import ENGINES

if TYPE_CHECKING:
    import torch

DTYPES = ("float32", "bfloat16", "float16")
"""The dtypes a file may declare, by torch's names: this module does not import torch, so a
coordinator reading files never loads it."""
METADATA_KEY = "intellect.numerics"


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype named ``name`` (one of :data:`DTYPES`)."""
    import torch

    if name not in DTYPES:
        raise ValueError(f"dtype {name[:40]!r} is not one of {DTYPES}")
    dtype: torch.dtype = getattr(torch, name)
    return dtype


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
            raise ValueError(f"numerics {text[:40]!r} is not ENGINE/DTYPE with ENGINE in {ENGINES} and DTYPE in {DTYPES}")
        return cls(engine, dtype)

    @classmethod
    def of(cls, model: torch.nn.Module, engine: str = "torch") -> Numerics:
        return cls.parse(f"{engine}/{str(next(model.parameters()).dtype).removeprefix('torch.')}")
