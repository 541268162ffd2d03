"""What generating means, for the nodes that generate and the validators that check.

A backend takes prompt token ids, one seed per sequence and :class:`SamplingParams`, and
returns one :class:`Completion` per prompt: tokens drawn by :mod:`shared.sampling`, their
logprobs, the final-norm hidden states of every *fed* generated token (completion[:-1],
what a validator's single prefill over prompt + completion[:-1] reproduces), and why it
stopped. :func:`prefill` is that validator pass.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Literal, Protocol, cast

import torch
from transformers import DynamicCache, PreTrainedModel

from intellect_protocol.shared.cpu_ledger import spent
from intellect_protocol.shared.models import cache_keyword, final_norm_outputs
from intellect_protocol.shared.numerics import Numerics
from intellect_protocol.shared.schemas import SamplingParams


@dataclass
class Completion:
    tokens: list[int]
    logprobs: list[float]
    hidden: torch.Tensor
    """``[len(tokens) - 1, hidden_size]`` bf16: the states the TOPLOC proofs commit to."""
    finish_reason: Literal["stop", "length", "turn"]
    """``turn``: a model turn of a multi-turn episode ended where its :class:`Turn` said (a tool call)."""

    def __getstate__(self) -> dict[str, object]:
        # Sent to another process as plain bf16 bits: torch's own reducer would give every
        # tensor a shared-memory segment, which costs more than these few KiB.
        return {**self.__dict__, "hidden": self.hidden.contiguous().view(torch.int16).numpy()}

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state, hidden=torch.from_numpy(state["hidden"]).view(torch.bfloat16))


@dataclass(frozen=True)
class Turn:
    """A model turn of a multi-turn episode: each row's prompt is the episode so far (the task's prompt and the
    completion up to here), and the turn's tokens continue the completion."""

    offsets: list[int]
    """Each row's completion position of the turn's first token: the seeded draw goes on counting from there."""
    carried: list[int]
    """Trailing prompt positions per row whose hidden states come back first (the completion's tokens no earlier
    call computed a state for), so a completion's states cover every position but its last."""
    limits: list[int]
    """Tokens each row may generate in this turn (what is left of the task's limit)."""
    ended: Callable[[list[int]], bool]
    """Whether a row's turn ends after these tokens of it (a tool call's closing text)."""


class InferenceBackend(Protocol):
    numerics: Numerics
    """How it computes, declared in every rollout file it produces."""
    hidden_size: int
    """The width of the states a :class:`Completion` carries."""

    def generate(
        self, prompts: list[list[int]], seeds: list[int], params: SamplingParams, turn: Turn | None = None
    ) -> list[Completion]:
        """Each prompt's completion; with ``turn``, one model turn of a multi-turn episode (see :class:`Turn`)."""
        ...


LOGITS_BLOCK_BYTES = 8 << 20
"""The most float32 logits a prefill's reader holds at once on a CPU; the sampling check's temporaries (the
seeded noise is computed in int64) take about ten times that. ``[tokens, vocab]`` for a whole completion is
never made: at a 151,936-token vocabulary and 4,096 tokens it alone is 2.5 GB a row."""
GPU_LOGITS_BLOCK_BYTES = 128 << 20
"""The same on a GPU, where each block's dozen kernels cost their launches whatever the block's size: 220
positions a block at Qwen's vocabulary instead of 13, and about 1.3 GB of temporaries."""


def logits_block_bytes(device: torch.device) -> int:
    return GPU_LOGITS_BLOCK_BYTES if device.type == "cuda" else LOGITS_BLOCK_BYTES


def logits_of(model: torch.nn.Module, states: torch.Tensor) -> torch.Tensor:
    """The model's logits (float32) from its final-norm outputs ``[..., hidden]``: its LM head, then the
    final soft cap the Gemma families apply, exactly as the model's own forward computes them."""
    logits = _head(model)(states)
    cap = getattr(model.config, "final_logit_softcapping", None)
    if cap is not None:
        logits = torch.tanh(logits / cap) * cap
    return cast(torch.Tensor, logits.float())


def _head(model: torch.nn.Module) -> torch.nn.Linear:
    return cast(torch.nn.Linear, cast(PreTrainedModel, model).get_output_embeddings())


def vocab_size(model: torch.nn.Module) -> int:
    """Rows of the model's LM head: the width of its logits."""
    return _head(model).weight.shape[0]


@dataclass(frozen=True)
class Prefilled:
    """One row of a prefill: the states its TOPLOC proofs commit to, and the logits that chose each
    completion token, made on demand in blocks (:meth:`blocks`)."""

    hidden: torch.Tensor
    """``[len(completion) - 1, hidden]`` bf16: the committed states."""
    states: torch.Tensor
    """``[len(completion), hidden]`` in the model's dtype: the final-norm outputs that chose each completion token."""
    model: torch.nn.Module

    def logits(self, start: int = 0, stop: int | None = None) -> torch.Tensor:
        """``[stop - start, vocab]`` float32 logits of completion positions ``start..stop``."""
        with torch.inference_mode():
            return logits_of(self.model, self.states[start:stop])

    def blocks(self, max_bytes: int | None = None) -> Iterator[tuple[int, torch.Tensor]]:
        """(first position, its block's logits) over the whole completion, each block at most ``max_bytes``
        (by default :func:`logits_block_bytes` of the states' device)."""
        step = max(1, (max_bytes or logits_block_bytes(self.states.device)) // (4 * vocab_size(self.model)))
        for start in range(0, len(self.states), step):
            yield start, self.logits(start, start + step)


def prefill(model: torch.nn.Module, prompt: list[int], completion: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """One forward pass over prompt + completion[:-1].

    Returns the committed hidden states ``[len(completion) - 1, hidden]`` (bf16) and the
    logits that chose each completion token ``[len(completion), vocab]`` (float32): for short
    completions; a validator reads :func:`prefill_batch`'s rows block by block instead.
    """
    row = prefill_batch(model, [prompt], [completion])[0]
    return row.hidden, row.logits()


@torch.inference_mode()
@spent("prefill")
def prefill_batch(
    model: torch.nn.Module,
    prompts: list[list[int]],
    completions: list[list[int]],
    pad_token_id: int = 0,
    chunk: int | None = None,
) -> list[Prefilled]:
    """:func:`prefill` for many sequences in one forward pass (or, with ``chunk``, in passes of
    that many positions over a KV cache, to bound memory on long sequences).

    The model's LM head runs on one position per pass only: the logits of every position are made
    later, a block at a time, from the final-norm outputs kept here (:class:`Prefilled`).

    Right padding: attention is causal, so a row's positions never see the padding after them,
    and each row's positions start at 0 exactly as in its own prefill.
    """
    device = next(model.parameters()).device
    rows = [p + c[:-1] for p, c in zip(prompts, completions, strict=True)]
    ids = torch.full((len(rows), max(map(len, rows))), pad_token_id, dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row)
    ids = ids.to(device)
    step = chunk or ids.shape[1]
    cache = DynamicCache() if step < ids.shape[1] else None
    keyword = cache_keyword(model)
    with final_norm_outputs(model) as captured:
        for start in range(0, ids.shape[1], step):
            model(input_ids=ids[:, start : start + step], **{keyword: cache}, use_cache=cache is not None, logits_to_keep=1)
    states = torch.cat(captured, dim=1)
    out = []
    for i, (prompt, completion) in enumerate(zip(prompts, completions)):
        start, n = len(prompt), len(completion)
        chose = states[i, start - 1 : start - 1 + n]
        out.append(Prefilled(hidden=chose[1:].to(torch.bfloat16).cpu(), states=chose, model=model))
    return out
