"""The devnet's run on a model of the user's: its verification tolerances measured before the run opens
(``intellect-validator calibrate`` in the nodes' numerics), or a given calibration checked up front."""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console

from intellect_protocol.devnet.processes import calibrate

CALIBRATION_ROWS = 128
"""Honest rows a --model is calibrated on before its run opens (the nodes' numerics only)."""


def calibrated(model: Path, numerics: str, max_tokens: int, workdir: Path, console: Console) -> Path:
    """The tolerances of ``model`` in the nodes' numerics, measured here: the shipped model's floors are
    a guess about any other model."""
    out = workdir / "calibration.json"
    with console.status(f"Calibrating verification on {model.name}: {CALIBRATION_ROWS} honest rows in {numerics}..."):
        calibrate(model, numerics, CALIBRATION_ROWS, max_tokens, out, workdir / "logs" / "calibrate.log")
    measured = json.loads(out.read_text())["measured"][0]
    console.print(
        f"Calibrated {numerics}: {measured['tokens']} tokens, {measured['deviations']} off the seeded draw, "
        f"largest logprob error {measured['logprob_max_error']:.2g}; the floors would have rejected "
        f"{measured['rejected_rows']} of {measured['rows']} honest rows. Tolerances in {out}."
    )
    return out


def unusable(calibration: Path, numerics: str) -> str | None:
    """Why a --calibration file cannot judge the devnet's nodes, or None."""
    try:
        tolerances = json.loads(calibration.read_text()).get("tolerances")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError) as e:
        return f"not a calibration file ({e})"
    if not isinstance(tolerances, dict) or numerics not in tolerances:
        return f"has no tolerances for the nodes' numerics, {numerics} (intellect-validator calibrate --engine ... --out FILE)"
    return None
