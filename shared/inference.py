"""What generating means, for the nodes that generate and the validators that check.

A backend takes prompt token ids, one seed per sequence and :class:`SamplingParams`, and
returns one :class:`Completion` per prompt: tokens drawn by :mod:`shared.sampling`, their
logprobs, the final-norm hidden states of every *fed* generated token (completion[:-1],
what a validator's single prefill over prompt + completion[:-1] reproduces), and why it
stopped. :func:`prefill` is that validator pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

import torch
from transformers import DynamicCache

from intellect_protocol.shared.models import cache_keyword, final_norm_outputs
from intellect_protocol.shared.numerics import Numerics
from intellect_protocol.shared.schemas import SamplingParams


@dataclass
class Completion:
    tokens: list[int]
    logprobs: list[float]
    hidden: torch.Tensor
    """``[len(tokens) - 1, hidden_size]`` bf16: the states the TOPLOC proofs commit to."""
    finish_reason: Literal["stop", "length"]

    def __getstate__(self) -> dict[str, object]:
        # Sent to another process as plain bf16 bits: torch's own reducer would give every
        # tensor a shared-memory segment, which costs more than these few KiB.
        return {**self.__dict__, "hidden": self.hidden.contiguous().view(torch.int16).numpy()}

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state, hidden=torch.from_numpy(state["hidden"]).view(torch.bfloat16))


class InferenceBackend(Protocol):
    numerics: Numerics
    """How it computes, declared in every rollout file it produces."""

    def generate(self, prompts: list[list[int]], seeds: list[int], params: SamplingParams) -> list[Completion]: ...


def prefill(model: torch.nn.Module, prompt: list[int], completion: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """One forward pass over prompt + completion[:-1].

    Returns the committed hidden states ``[len(completion) - 1, hidden]`` (bf16) and the
    logits that chose each completion token ``[len(completion), vocab]`` (float32).
    """
    return prefill_batch(model, [prompt], [completion])[0]


@torch.inference_mode()
def prefill_batch(
    model: torch.nn.Module,
    prompts: list[list[int]],
    completions: list[list[int]],
    pad_token_id: int = 0,
    chunk: int | None = None,
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """:func:`prefill` for many sequences in one forward pass (or, with ``chunk``, in passes of
    that many positions over a KV cache, to bound memory on long sequences).

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
    pieces = []
    with final_norm_outputs(model) as captured:
        for start in range(0, ids.shape[1], step):
            out = model(input_ids=ids[:, start : start + step], **{keyword: cache}, use_cache=cache is not None)
            pieces.append(out.logits.float())
    logits, hidden = torch.cat(pieces, dim=1), torch.cat(captured, dim=1)
    out = []
    for i, (prompt, completion) in enumerate(zip(prompts, completions)):
        start, n = len(prompt), len(completion)
        out.append((hidden[i, start : start + n - 1].to(torch.bfloat16).cpu(), logits[i, start - 1 : start - 1 + n].cpu()))
    return out
