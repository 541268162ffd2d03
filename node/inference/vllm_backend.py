"""The vLLM backend for GPU nodes (the ``[vllm]`` extra, vLLM's V0 engine), imported lazily.

vLLM decodes; our seeded sampler decides. Each request carries a :class:`SeededLogitsProcessor`
that replaces its logits with :func:`shared.sampling.sampling_scores` for its seed and position,
and vLLM runs greedy over them, so the token it picks is exactly the one a validator
re-derives; the processor also records the sampled token's logprob under the raw logits.

Hidden states: vLLM's logits layer receives the final-norm output of every scheduled token
together with the batch's sampling metadata. A forward pre-hook on that layer
(:func:`record_hidden_states`) takes the rows vLLM samples from and hands each one to its
sequence's processor, keyed by the position of the generated token it was fed, so batching,
preemption and recomputation cannot misalign them.

Needs vLLM with the V0 engine (per-request logits processors, in-process model access):
``pip install 'intellect-protocol[vllm]'``. The engine cannot run without a GPU; everything
below except :class:`VllmBackend` itself is tested without vLLM installed.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from shared.inference import Completion
from shared.numerics import Numerics
from shared.sampling import sampling_scores, token_logprobs
from shared.schemas import SamplingParams


def vllm_sampling_kwargs(params: SamplingParams, eos_token_id: int) -> dict[str, Any]:
    """Keyword arguments for ``vllm.SamplingParams``: greedy over our scores, our stopping rules."""
    return {
        "n": 1,
        "temperature": 0.0,  # the processor has already applied temperature, top-p and noise
        "top_p": 1.0,
        "max_tokens": params.max_tokens,
        "ignore_eos": not params.stop_on_eos,
        "stop_token_ids": [eos_token_id] if params.stop_on_eos else [],
        "skip_special_tokens": False,
        "detokenize": False,
    }


class SeededLogitsProcessor:
    """Per-request processor ``(generated_token_ids, logits[vocab]) -> scores[vocab]``.

    Also the request's record: ``logprobs[i]`` of generated token i and, through
    :meth:`record_hidden`, the hidden state produced by feeding generated token i.
    """

    def __init__(self, seed: int, params: SamplingParams) -> None:
        self.seed = seed
        self.params = params
        self.logprobs: list[float] = []
        self.hidden: dict[int, torch.Tensor] = {}

    def __call__(self, generated: list[int] | tuple[int, ...], logits: torch.Tensor) -> torch.Tensor:
        position = len(generated)
        seeds = torch.tensor([self.seed], dtype=torch.int64, device=logits.device)
        positions = torch.tensor([position], dtype=torch.int64, device=logits.device)
        scores = sampling_scores(logits[None].float(), seeds, positions, self.params.temperature, self.params.top_p)[0]
        token = scores.argmax()
        del self.logprobs[position:]  # a recomputed step (preemption) replaces its earlier record
        self.logprobs.append(float(token_logprobs(logits[None].float(), token[None], self.params.temperature)[0]))
        # Greedy decoding downstream must pick `token`: make it the unique maximum.
        out = torch.full_like(logits, float("-inf"))
        out[token] = 0.0
        return out

    def record_hidden(self, fed_position: int, state: torch.Tensor) -> None:
        self.hidden[fed_position] = state.detach().to("cpu", torch.bfloat16)

    def take_hidden(self, completion_length: int, hidden_size: int) -> torch.Tensor:
        """The ``[completion_length - 1, hidden]`` states the proofs commit to."""
        wanted = range(max(completion_length - 1, 0))
        missing = [i for i in wanted if i not in self.hidden]
        if missing:
            raise ValueError(f"no hidden state for generated positions {missing[:5]} of {completion_length}")
        if not wanted:
            return torch.empty(0, hidden_size, dtype=torch.bfloat16)
        return torch.stack([self.hidden[i] for i in wanted])


def record_hidden_states(hidden_states: torch.Tensor, sampling_metadata: Any) -> None:
    """Hand the sampled rows of one engine step to their sequences' processors.

    ``hidden_states``: ``[scheduled_tokens, hidden]`` final-norm output; ``sampling_metadata``:
    vLLM's ``SamplingMetadata`` (``selected_token_indices`` and ``seq_groups``, each with
    ``seq_ids``, ``sample_indices``, ``seq_data`` and ``sampling_params``). The row a sequence
    samples from was produced by feeding its last generated token, i.e. generated position
    ``output_len - 1``; a fresh prompt's row (``output_len == 0``) commits nothing.
    """
    rows = hidden_states.index_select(0, sampling_metadata.selected_token_indices)
    for group in sampling_metadata.seq_groups:
        processors = [p for p in group.sampling_params.logits_processors or () if isinstance(p, SeededLogitsProcessor)]
        if not processors:
            continue
        for seq_id, row in zip(group.seq_ids, group.sample_indices):
            fed = group.seq_data[seq_id].get_output_len() - 1
            if fed >= 0:
                processors[0].record_hidden(fed, rows[row])


def _logits_layer_hook(module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
    # vLLM calls logits_processor(lm_head, hidden_states, sampling_metadata[, embedding_bias]).
    named = dict(zip(("lm_head", "hidden_states", "sampling_metadata"), args)) | kwargs
    record_hidden_states(named["hidden_states"], named["sampling_metadata"])


class VllmBackend:
    """:class:`shared.inference.InferenceBackend` on a single-GPU vLLM engine."""

    def __init__(self, model_path: str, eos_token_id: int, *, gpu_memory_utilization: float = 0.85, **engine: Any) -> None:
        os.environ.setdefault("VLLM_USE_V1", "0")  # per-request logits processors live in the V0 engine
        try:
            import vllm
        except ImportError as error:
            raise ImportError("the vLLM backend needs the [vllm] extra: pip install 'intellect-protocol[vllm]'") from error
        self._vllm = vllm
        self.eos = eos_token_id
        self.numerics = Numerics("vllm", "bfloat16")
        self.llm = vllm.LLM(
            model=model_path,
            dtype="bfloat16",
            tensor_parallel_size=1,  # the hook below must run in this process
            enable_prefix_caching=False,
            gpu_memory_utilization=gpu_memory_utilization,
            **engine,
        )
        model = self.llm.llm_engine.model_executor.driver_worker.model_runner.model
        model.logits_processor.register_forward_pre_hook(_logits_layer_hook, with_kwargs=True)
        self.hidden_size = int(model.config.hidden_size)

    def generate(self, prompts: list[list[int]], seeds: list[int], params: SamplingParams) -> list[Completion]:
        if len(prompts) != len(seeds):
            raise ValueError("one seed per prompt")
        processors = [SeededLogitsProcessor(seed, params) for seed in seeds]
        sampling = [
            self._vllm.SamplingParams(**vllm_sampling_kwargs(params, self.eos), logits_processors=[processor])
            for processor in processors
        ]
        requests = [{"prompt_token_ids": prompt} for prompt in prompts]
        outputs = self.llm.generate(requests, sampling, use_tqdm=False)
        completions = []
        for output, processor in zip(outputs, processors):
            generated = output.outputs[0]
            tokens = list(generated.token_ids)
            completions.append(
                Completion(
                    tokens=tokens,
                    logprobs=processor.logprobs[: len(tokens)],
                    hidden=processor.take_hidden(len(tokens), self.hidden_size),
                    finish_reason="stop" if tokens and tokens[-1] == self.eos and params.stop_on_eos else "length",
                )
            )
        return completions
