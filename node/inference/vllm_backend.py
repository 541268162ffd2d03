"""The vLLM backend for GPU nodes (the ``[vllm]`` extra), imported lazily.

vLLM decodes; our seeded sampler decides. Each request carries a logits processor that
replaces the logits with :func:`shared.sampling.sampling_scores` for its seed and position
and runs greedy, so the token vLLM picks is exactly the one a validator re-derives; the
processor also records the sampled token's logprob under the unmodified logits. A forward
hook on the final norm records hidden states, which :class:`HiddenStateBook` assigns back
to sequences.

These are the parts that need neither a GPU nor vLLM, and are tested here; the engine
wrapper that installs them (and the final-norm hook inside vLLM's worker) is not written yet.
"""

from __future__ import annotations

from typing import Any

import torch

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
    """Per-request processor ``(generated_token_ids, logits[vocab]) -> scores[vocab]``."""

    def __init__(self, seed: int, params: SamplingParams) -> None:
        self.seed = seed
        self.params = params
        self.logprobs: list[float] = []

    def __call__(self, generated: list[int] | tuple[int, ...], logits: torch.Tensor) -> torch.Tensor:
        position = len(generated)
        seeds = torch.tensor([self.seed], dtype=torch.int64, device=logits.device)
        positions = torch.tensor([position], dtype=torch.int64, device=logits.device)
        scores = sampling_scores(logits[None], seeds, positions, self.params.temperature, self.params.top_p)[0]
        token = scores.argmax()
        del self.logprobs[position:]  # a recomputed step (preemption) replaces its earlier record
        self.logprobs.append(float(token_logprobs(logits[None], token[None], self.params.temperature)[0]))
        # Greedy decoding downstream must pick `token`: make it the unique maximum.
        out = torch.full_like(logits, float("-inf"))
        out[token] = 0.0
        return out


class HiddenStateBook:
    """Per-sequence hidden states of fed generated tokens, from batched decode steps.

    ``record(step_ids, states)`` takes the sequence ids of one decode step's rows and the
    final-norm states ``[rows, hidden]``; prefill rows (``None`` ids) are ignored. A
    sequence's first decode step feeds its first generated token, so its states line up
    with completion[:-1].
    """

    def __init__(self) -> None:
        self.states: dict[str, list[torch.Tensor]] = {}

    def record(self, step_ids: list[str | None], states: torch.Tensor) -> None:
        if len(step_ids) != states.shape[0]:
            raise ValueError(f"{len(step_ids)} ids for {states.shape[0]} rows")
        rows = states.detach().to("cpu", torch.bfloat16)
        for seq_id, row in zip(step_ids, rows):
            if seq_id is not None:
                self.states.setdefault(seq_id, []).append(row)

    def take(self, seq_id: str, completion_length: int, hidden_size: int) -> torch.Tensor:
        """The ``[completion_length - 1, hidden]`` states of a finished sequence (and forget them)."""
        rows = self.states.pop(seq_id, [])[: max(completion_length - 1, 0)]
        if len(rows) != max(completion_length - 1, 0):
            raise ValueError(f"sequence {seq_id}: {len(rows)} hidden states for {completion_length} tokens")
        return torch.stack(rows) if rows else torch.empty(0, hidden_size, dtype=torch.bfloat16)
