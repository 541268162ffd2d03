"""A run's calibrated tolerances: what the wire accepts, and that a calibration only ever widens the floors."""

from __future__ import annotations

import pytest
from pydantic import TypeAdapter, ValidationError

from intellect_protocol.shared.tolerances import TOLERANCES, Calibration, tolerance_for

pytestmark = pytest.mark.unit

CALIBRATION = TypeAdapter(Calibration)


def test_widening_never_narrows_and_ignores_what_is_not_a_bound() -> None:
    floor = TOLERANCES["bfloat16"]
    wider = floor.widened({"max_gap": 0.5, "logprob_bias": 0.0, "flip_scale": 0.0, "colour": 3.0})
    assert wider.max_gap == 0.5 and wider.logprob_bias == floor.logprob_bias and wider.flip_scale == floor.flip_scale
    assert wider.outliers == floor.outliers


def test_a_calibration_names_real_numerics_with_sane_bounds() -> None:
    good = {"torch/float32": TOLERANCES["float32"].model_dump(), "vllm/bfloat16": TOLERANCES["bfloat16"].model_dump()}
    assert set(CALIBRATION.validate_python(good)) == set(good)
    for bad in (
        {},
        {"torch/int8": TOLERANCES["float32"].model_dump()},
        {"cuda/float32": TOLERANCES["float32"].model_dump()},
        {"torch/float32": {**TOLERANCES["float32"].model_dump(), "max_gap": -1}},
        {"torch/float32": {**TOLERANCES["float32"].model_dump(), "flip_scale": 0}},
        {"torch/float32": {**TOLERANCES["float32"].model_dump(), "extra": 1}},
        {f"torch/float32{'x' * i}": TOLERANCES["float32"].model_dump() for i in range(9)},
    ):
        with pytest.raises(ValidationError):
            CALIBRATION.validate_python(bad)
    # Narrower than the floor would reject honest work the floor was measured to cover.
    narrower = {"vllm/bfloat16": {**TOLERANCES["bfloat16"].model_dump(), "max_gap": 0.01, "outliers": 0}}
    with pytest.raises(ValidationError, match="max_gap, outliers below the floor"):
        CALIBRATION.validate_python(narrower)


def test_an_uncalibrated_run_judges_any_numerics_at_the_floor_and_a_calibrated_one_only_its_own() -> None:
    assert tolerance_for("vllm/bfloat16", "bfloat16", None) == TOLERANCES["bfloat16"]
    calibrated = {"torch/float32": TOLERANCES["float32"].widened({"max_gap": 0.01})}
    assert tolerance_for("torch/float32", "float32", calibrated).max_gap == 0.01
    assert tolerance_for("vllm/float32", "float32", calibrated) is None
