"""Whether this machine can serve a run before it joins: the run's environment plugin at the pinned
version, the compute dtype and engine, and room for the run's model in the memory it would run in.

The memory figure is an estimate from the model's own files, without loading it: the weights (every
tensor's element count, read from the safetensors headers, in the node's dtype; twice for the torch
backend, which keeps the previous policy step while its last tasks finish) plus the KV cache of one
task (each of its sequences at the run's longest prompt plus ``max_tokens``). It must fit in
:data:`USABLE_SHARE` of the GPU's memory (vLLM on a GPU) or of RAM (everything else).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from intellect_protocol.node.settings import NodeSettings
from intellect_protocol.shared.environments.registry import EnvironmentUnavailable, get_environment
from intellect_protocol.shared.models import resolve_model
from intellect_protocol.shared.run_schemas import RunInfo
from intellect_protocol.shared.schemas import NodeSpecs

BYTES_PER = {"float32": 4, "bfloat16": 2, "float16": 2}
USABLE_SHARE = 0.8
"""Share of the memory the model may take: the rest is the engine's workspace, the OS and the node's other processes."""


@dataclass(frozen=True)
class Fit:
    """One run against this machine: what its model needs, what there is, and why it cannot be served."""

    run: RunInfo
    needs_bytes: int | None
    """None: the model is not a local directory (it is downloaded at join, and measured then)."""
    has_bytes: int
    where: str
    problems: list[str]


def parameter_count(model_dir: Path) -> int:
    """Elements of every tensor in the directory's safetensors files, read from their headers only."""
    from safetensors import safe_open

    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{model_dir} holds no .safetensors weights")
    total = 0
    for path in files:
        with safe_open(str(path), "pt") as weights:
            for name in weights.keys():
                shape = weights.get_slice(name).get_shape()
                count = 1
                for size in shape:
                    count *= size
                total += count
    return total


def kv_cache_bytes(config: dict[str, Any], sequences: int, tokens: int, dtype: str) -> int:
    """Keys and values of every layer for ``sequences`` sequences of ``tokens`` tokens."""
    text = config.get("text_config", config)
    heads = text["num_attention_heads"]
    kv_heads = text.get("num_key_value_heads") or heads
    head_dim = text.get("head_dim") or text["hidden_size"] // heads
    return int(2 * text["num_hidden_layers"] * kv_heads * head_dim * tokens * sequences * BYTES_PER[dtype])


def fit(run: RunInfo, settings: NodeSettings, specs: NodeSpecs) -> Fit:
    problems = []
    prompts: list[str] = []
    try:
        prompts = [p.prompt for p in get_environment(run.environment, run.environment_version).problems()]
    except EnvironmentUnavailable as e:
        problems.append(str(e))
    mine = f"{settings.backend}/{settings.dtype}"
    if run.tolerances is not None and mine not in run.tolerances:
        problems.append(
            f"this node computes as {mine} (INTELLECT_NODE_BACKEND, INTELLECT_NODE_DTYPE) and the run, calibrated on its model, "
            f"admits only {', '.join(sorted(run.tolerances))}"
        )
    gpu = settings.backend == "vllm" and specs.gpus
    has = int((specs.gpus[0].memory_bytes if gpu else specs.ram_bytes) * USABLE_SHARE)
    where = f"{specs.gpus[0].name} memory" if gpu else "RAM"
    model_dir = Path(resolve_model(run.model))
    if not model_dir.is_dir():
        return Fit(run, None, has, where, problems)
    try:
        config = json.loads((model_dir / "config.json").read_text())
        weights = parameter_count(model_dir) * BYTES_PER[settings.dtype] * (2 if settings.backend == "torch" else 1)
        longest = 0
        if prompts:
            from intellect_protocol.shared.models import encode_prompt, load_tokenizer

            longest = len(encode_prompt(load_tokenizer(str(model_dir)), max(prompts, key=len), run.prompting))
        sequences = run.prompts_per_task * run.samples_per_prompt
        needs = weights + kv_cache_bytes(config, sequences, longest + run.sampling.max_tokens, settings.dtype)
    except (OSError, ValueError, KeyError) as e:
        return Fit(run, None, has, where, [*problems, f"cannot read model {run.model}: {type(e).__name__}: {e}"])
    if needs > has:
        problems.append(
            f"model {run.model} needs about {needs / 2**30:.2f} GiB in {settings.dtype} (weights and one task's KV cache); "
            f"this machine has {has / 2**30:.2f} GiB of usable {where}"
        )
    return Fit(run, needs, has, where, problems)
