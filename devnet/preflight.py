"""What ``intellect-devnet`` checks before it starts anything: each problem is one sentence saying what to do,
never a traceback after some roles have already started."""

from __future__ import annotations

from importlib.util import find_spec
from pathlib import Path

from intellect_protocol.devnet.calibration import unusable


def problems(backend: str, model: Path | None, calibration: Path | None, workdir: Path | None, islands: int) -> list[str]:
    """Every reason this devnet cannot start as asked (empty when it can)."""
    found = []
    if backend == "vllm":
        from intellect_protocol.shared.engines import vllm_unusable

        found += vllm_unusable()
    if islands and find_spec("torchft") is None:
        found.append("--islands needs the [islands] extra (torchft): pip install 'intellect-protocol[islands]'.")
    if model is not None:
        found += _model_problems(model)
    if calibration is not None and (refusal := unusable(calibration, f"{backend}/float32")):
        found.append(f"--calibration {calibration}: {refusal}.")
    if workdir is not None and (earlier := earlier_devnet(workdir)):
        found.append(
            f"{workdir} holds an earlier devnet ({', '.join(earlier)}); nothing in it was changed. "
            "Pass a new --workdir, or delete that folder to start afresh."
        )
    return found


def _model_problems(model: Path) -> list[str]:
    if not (model / "config.json").is_file():
        return [f"{model} is not a Hugging Face model directory: it has no config.json."]
    from intellect_protocol.shared.models import TOKENIZER_FILES, TokenizerMissing, load_tokenizer

    try:
        load_tokenizer(model)
    except TokenizerMissing as e:
        return [str(e)]
    except (ValueError, OSError):  # transformers' own refusal to build one from what is there
        return [f"The tokenizer of {model} does not load: {TOKENIZER_FILES}"]
    return []


def earlier_devnet(workdir: Path) -> list[str]:
    """What an earlier devnet left in ``workdir``: its results, which a new one must not overwrite."""
    return [name for name in ("summary.json", "ledger.db", "admin-token", "logs") if (workdir / name).exists()]
