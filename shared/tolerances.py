"""Tolerances: how far honest work in one numerics may be from a validator's recomputation in the same
numerics (:mod:`shared.numerics` says where the disagreement comes from), as published with a run.

:data:`TOLERANCES` are the bounds measured on the shipped model: the floor of every run. A run may be
calibrated on its own model (``intellect-validator calibrate``, then ``run create --calibration``):
its bounds are then the measured ones with a margin wherever those are wider, per numerics, and a file
computed in numerics the run was not calibrated for is refused. A calibration never narrows a bound
below the floor: a few hundred calibration rows cannot see the rarest honest disagreements (one token
0.57 of the logit scale off in 20,032 bf16 rows), which the floor was measured to cover.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

ENGINES = ("torch", "vllm")
DTYPE_NAMES = ("float32", "bfloat16", "float16")


class Tolerance(BaseModel):
    """How far honest work in one dtype may be from the validator's recomputation in that dtype."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_gap: float = Field(ge=0, le=1e3)
    """Largest top-1 minus claimed score, relative to the logit scale, that numerics can explain;
    beyond it a token is not the seeded draw (a hard failure)."""
    flip_scale: float = Field(gt=0, le=1e3)
    """s in the chance ``exp(-gap / s) / 2`` that honest numerics flip a position with this gap."""
    logprob_abs: float = Field(ge=0, le=1e3)
    logprob_rel: float = Field(ge=0, le=1e3)
    """A claimed logprob may differ from the recomputed one by ``abs + rel * |logprob|`` nats."""
    logprob_bias: float = Field(ge=0, le=1e3)
    """Largest mean signed logprob difference over a row (honest errors cancel; a shift does not)."""
    nucleus_mass: float = Field(ge=0, le=1)
    """How near the top-p boundary a token outside the validator's nucleus may lie."""
    outliers: int = Field(ge=0, le=1_000_000)
    """Tokens per file that may lie beyond ``max_gap`` (their logprobs unchecked, their rows untrained):
    bf16 decode and prefill, at rare positions, disagree by far more than rounding elsewhere
    (one token 0.57 of the logit scale off in 20,032 honest bf16 rows; none in fp32)."""

    def widened(self, measured: dict[str, float]) -> Tolerance:
        """This bound, widened to ``measured`` (fitted values by field name) wherever they are wider."""
        return self.model_copy(update={k: max(getattr(self, k), v) for k, v in measured.items() if k in type(self).model_fields})


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
"""The floor of every run: measured on the shipped model (:mod:`shared.numerics`)."""


def _numerics_name(text: str) -> str:
    engine, _, dtype = text.partition("/")
    if engine not in ENGINES or dtype not in DTYPE_NAMES:
        raise ValueError(f"{text[:40]!r} is not ENGINE/DTYPE with ENGINE in {ENGINES} and DTYPE in {DTYPE_NAMES}")
    return text


NumericsName = Annotated[str, Field(max_length=32), AfterValidator(_numerics_name)]
"""``engine/dtype``, as a rollout file declares it (e.g. ``torch/bfloat16``)."""


def _at_least_the_floor(calibration: dict[str, Tolerance]) -> dict[str, Tolerance]:
    for numerics, tolerance in calibration.items():
        floor = TOLERANCES[numerics.partition("/")[2]]
        if narrower := [k for k in type(floor).model_fields if getattr(tolerance, k) < getattr(floor, k)]:
            raise ValueError(
                f"{numerics}: {', '.join(narrower)} below the floor measured on the shipped model "
                f"({', '.join(f'{k} >= {getattr(floor, k):g}' for k in narrower)}); a calibration only widens bounds"
            )
    return calibration


Calibration = Annotated[dict[NumericsName, Tolerance], Field(min_length=1, max_length=8), AfterValidator(_at_least_the_floor)]
"""A run's tolerances by the numerics it admits (a calibrated run admits only these), none below the floor."""


OPERATOR_CEILING = 4.0
"""How far an operate-scope admin token may widen a run's bounds, as a factor of the floor (the widest
calibration measured on a real family so far: 2.2x, a bf16 flip scale). Wider needs the admin scope, is
written to the audit log, and the run's public config and page say by how much (:func:`widening`):
at 10x the floor a +0.019-nat shift of every logprob reached training."""


def widening(calibration: dict[str, Tolerance] | None) -> float:
    """The most any bound of ``calibration`` exceeds the floor of its dtype, as a factor (1.0 uncalibrated;
    a count floored at 0 counts from 1)."""
    if not calibration:
        return 1.0
    factors: list[float] = [
        getattr(tolerance, name) / max(getattr(floor, name), 1 if name == "outliers" else 0)
        for numerics, tolerance in calibration.items()
        for floor in [TOLERANCES[numerics.partition("/")[2]]]
        for name in type(tolerance).model_fields
    ]
    return max(1.0, *factors)


def tolerance_for(numerics: str, dtype: str, calibration: dict[str, Tolerance] | None) -> Tolerance | None:
    """The bound a file computed in ``numerics`` (of ``dtype``) is judged by: the run's calibrated one, the floor
    for an uncalibrated run, or None when the run was calibrated without these numerics."""
    if calibration is None:
        return TOLERANCES[dtype]
    return calibration.get(numerics)
