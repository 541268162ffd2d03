"""The default backend: batched generation with transformers on torch, KV cache, left padding.

Nodes generate with it; validators calibrating a run's tolerances generate honest work with it too.

Hidden states come from a hook on the final norm during generation itself, so proofs need
no second pass. A row that finishes leaves the batch (and its cache) at once, so a step costs only
the rows still generating; the cache takes each step's keys and values without copying what it holds
(:mod:`shared.kv_cache`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from transformers import Cache, PreTrainedModel

from intellect_protocol.shared.inference import Completion, Turn
from intellect_protocol.shared.kv_cache import buffered_cache
from intellect_protocol.shared.models import cache_keyword, final_norm_outputs
from intellect_protocol.shared.numerics import Numerics
from intellect_protocol.shared.sampling import sample
from intellect_protocol.shared.schemas import SamplingParams


class TorchBackend:
    def __init__(
        self,
        model: PreTrainedModel,
        eos_token_id: int,
        pad_token_id: int,
        *,
        threads: int | None = 1,
        kv_cache: Callable[[int], Cache] = buffered_cache,
    ) -> None:
        """``threads``: torch's intra-op threads for this process (1, so processes sharing cores
        do not slow each other down; None leaves torch's default); ``kv_cache``: makes a generate call's
        cache from the most positions a row will hold (``bench/kv_cache.py`` passes transformers' own)."""
        if threads is not None:
            torch.set_num_threads(threads)
        self.model = model
        self.eos = eos_token_id
        self.pad = pad_token_id
        self.device = next(model.parameters()).device
        self.numerics = Numerics.of(model)
        self.hidden_size: int = model.config.hidden_size
        self.cache_keyword = cache_keyword(model)
        self.kv_cache = kv_cache

    @torch.inference_mode()
    def generate(
        self, prompts: list[list[int]], seeds: list[int], params: SamplingParams, turn: Turn | None = None
    ) -> list[Completion]:
        """Each prompt's completion; with ``turn``, one model turn of a multi-turn episode (see :class:`Turn`)."""
        if len(prompts) != len(seeds):
            raise ValueError("one seed per prompt")
        if any(not p for p in prompts):
            raise ValueError("empty prompt")
        batch, longest = len(prompts), max(map(len, prompts))
        ids = torch.full((batch, longest), self.pad, dtype=torch.long)
        mask = torch.zeros((batch, longest), dtype=torch.long)
        for row, prompt in enumerate(prompts):
            ids[row, longest - len(prompt) :] = torch.tensor(prompt)
            mask[row, longest - len(prompt) :] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        seed_t = torch.tensor(seeds, dtype=torch.int64, device=self.device)
        offsets = torch.tensor(turn.offsets if turn else [0] * batch, dtype=torch.int64, device=self.device)
        limits = turn.limits if turn else [params.max_tokens] * batch

        tokens: list[list[int]] = [[] for _ in range(batch)]
        logprobs: list[list[float]] = [[] for _ in range(batch)]
        hidden: list[list[torch.Tensor]] = [[] for _ in range(batch)]
        finish: list[str | None] = [None] * batch
        cache = self.kv_cache(longest + max(limits, default=0))
        positions = (mask.cumsum(-1) - 1).clamp(min=0)

        with final_norm_outputs(self.model) as captured:
            # The prompt's last position only: logits of every prompt position are [batch, prompt, vocab].
            logits = self.model(
                input_ids=ids,
                attention_mask=mask,
                position_ids=positions,
                **{self.cache_keyword: cache},
                use_cache=True,
                logits_to_keep=1,
            ).logits[:, -1]
            if turn is not None:
                for row, carried in enumerate(turn.carried):
                    hidden[row] += list(captured[-1][row, longest - carried :].to(torch.bfloat16).cpu()) if carried else []
            for row, limit in enumerate(limits):
                finish[row] = "length" if limit <= 0 else None
            next_position = positions[:, -1] + 1
            rows = list(range(batch))  # the prompt each row of the batch is
            for step in range(max(limits, default=0)):
                if all(finish):
                    break
                chosen, chosen_logprobs = sample(logits, seed_t, offsets + step, params.temperature, params.top_p)
                # One copy to the host a step, not one a row: on a GPU each is a wait for the device.
                for row, token, logprob in zip(rows, chosen.tolist(), chosen_logprobs.tolist(), strict=True):
                    if finish[row] is None:
                        tokens[row].append(token)
                        logprobs[row].append(logprob)
                        if params.stop_on_eos and token == self.eos:
                            finish[row] = "stop"
                        elif len(tokens[row]) == limits[row]:
                            finish[row] = "length"
                        elif turn is not None and turn.ended(tokens[row]):
                            finish[row] = "turn"
                if all(finish):
                    break
                if any(finish[row] for row in rows):
                    # Long reasoning ends anywhere from one to twice the shortest: a finished row kept in the batch
                    # would cost what a live one does at every step to the longest.
                    keep = torch.tensor([i for i, row in enumerate(rows) if finish[row] is None], device=self.device)
                    cache.batch_select_indices(keep)
                    chosen, mask, seed_t, offsets, next_position = (
                        t[keep] for t in (chosen, mask, seed_t, offsets, next_position)
                    )
                    rows = [row for row in rows if finish[row] is None]
                mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
                captured.clear()
                logits = self.model(
                    input_ids=chosen[:, None],
                    attention_mask=mask,
                    position_ids=next_position[:, None],
                    **{self.cache_keyword: cache},
                    use_cache=True,
                ).logits[:, -1]
                state = captured[-1][:, -1].to(torch.bfloat16).cpu()
                for i, row in enumerate(rows):
                    hidden[row].append(state[i])
                next_position = next_position + 1

        return [
            Completion(
                tokens=tokens[row],
                logprobs=logprobs[row],
                hidden=torch.stack(hidden[row]) if hidden[row] else torch.empty(0, self.hidden_size, dtype=torch.bfloat16),
                finish_reason=finish[row],  # type: ignore[arg-type]
            )
            for row in range(batch)
        ]
