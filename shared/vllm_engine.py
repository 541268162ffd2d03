"""Our half of a vLLM engine: it runs inside vLLM's worker, next to the model.

vLLM loads these classes by name (``LLM(logits_processors=[...], worker_extension_cls=...)``),
so they live wherever the model does: in the calling process when
``VLLM_ENABLE_V1_MULTIPROCESSING=0``, in vLLM's engine-core process otherwise (GPU deployments).

- A request is ours when ``SamplingParams.extra_args[KEY]`` holds a :class:`Seeded` spec; vLLM
  runs it greedily (temperature 0) and our logits processor leaves exactly one finite logit per
  row: the token :func:`shared.sampling.sample` draws for the request's seed at that position.
  It records the token's logprob under the raw logits. A spec's ``forced`` tokens come first,
  fed as generated tokens: a multi-turn episode's tokens that no pass has computed a state for
  yet (the environment's reply) get their states from the steps that feed them.
- A forward pre-hook on the model's logits layer keeps the final-norm rows vLLM computes logits
  from this step (``[logits rows, hidden]``, one per request being sampled, in the order of the
  logits the processor sees); the processor files each under the generated position whose token
  was fed to produce it.
- Records are keyed by (request id, generated position) and overwritten on recomputation, so
  chunked prefill (intermediate chunks sample nothing we keep), preemption (the request is
  prefilled again) and batch reordering cannot misalign them.
- :class:`ProofRecorder` joins vLLM's worker: ``collective_rpc("intellect_install")`` hooks the
  model, ``intellect_reload`` swaps in a policy step's weights, ``intellect_take`` hands records
  back. All carry only plain data, so they cross vLLM's process boundary without pickled code.

Two model runners call processors through different interfaces; :class:`SeededSampler` serves
both, so the same class works whichever runner vLLM picks for the device.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import torch
from vllm import SamplingParams as VllmParams
from vllm.exceptions import VLLMValidationError
from vllm.v1.sample.logits_processor import BatchUpdate, MoveDirectionality
from vllm.v1.sample.logits_processor import LogitsProcessor as V1Processor
from vllm.v1.worker.gpu.sample.logits_processor import LogitsProcessor as V2Processor

from intellect_protocol.shared.sampling import sample

KEY = "intellect"
"""The ``extra_args`` entry that marks a request as ours."""


@dataclass(frozen=True)
class Seeded:
    """One request's sampling, as carried in ``extra_args[KEY]`` (a plain dict on the wire)."""

    id: str
    seed: int
    prompt_len: int
    temperature: float
    top_p: float
    forced: list[int] = field(default_factory=list)
    """Tokens the first generated positions take, drawing nothing."""
    offset: int = 0
    """The draw's position for the first token after ``forced`` (a turn's place in its episode)."""

    @classmethod
    def of(cls, params: VllmParams) -> Seeded | None:
        spec = (params.extra_args or {}).get(KEY)
        return None if spec is None else cls(**spec)


@dataclass
class Record:
    logprobs: dict[int, float] = field(default_factory=dict)
    hidden: dict[int, torch.Tensor] = field(default_factory=dict)


RECORDS: dict[str, Record] = {}
"""Per request id, filled by the processors; emptied by :meth:`ProofRecorder.intellect_take`."""
_step_hidden: list[torch.Tensor | None] = [None]


def _keep_logit_rows(_module: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> None:
    # vLLM calls logits_processor(lm_head, hidden_states[logits rows], ...).
    _step_hidden[0] = args[1]


def validate(params: VllmParams) -> None:
    """Refuse, at admission, a request of ours that vLLM would not run as greedy over our scores."""
    try:
        spec = Seeded.of(params)
    except TypeError as error:
        raise VLLMValidationError(f"extra_args[{KEY!r}] is not a sampling spec: {error}") from None
    if spec is not None and (params.temperature != 0 or params.n != 1):
        raise VLLMValidationError(f"{KEY} requests run with temperature 0 and n 1 (the processor samples)")


def choose(logits: torch.Tensor, rows: list[int], specs: list[Seeded], positions: list[int]) -> None:
    """Draw (or, among its spec's ``forced``, set) each listed row's token for its request at ``positions``
    (generated index) in place.

    ``logits``: ``[logits rows, vocab]`` float32. A negative position is a row that samples
    nothing we keep (an intermediate prefill chunk): it is left alone.
    """
    hidden, _step_hidden[0] = _step_hidden[0], None  # this step's rows, never a later step's
    kept = [(row, spec, position) for row, spec, position in zip(rows, specs, positions) if position >= 0]
    if not kept:
        return
    # The row sampling generated position p was produced by feeding generated token p - 1.
    fed = [(row, spec, position - 1) for row, spec, position in kept if position > 0]
    if fed and hidden is not None and hidden.shape[0] == logits.shape[0]:
        states = hidden[[row for row, _, _ in fed]].to("cpu", torch.bfloat16)
        for (_, spec, position), state in zip(fed, states):
            RECORDS.setdefault(spec.id, Record()).hidden[position] = state
    by_params: dict[tuple[float, float], list[tuple[int, Seeded, int]]] = {}
    for row, spec, position in kept:
        if position < len(spec.forced):
            RECORDS.setdefault(spec.id, Record()).logprobs[position] = 0.0
            logits[row] = float("-inf")
            logits[row, spec.forced[position]] = 0.0
        else:
            by_params.setdefault((spec.temperature, spec.top_p), []).append((row, spec, position))
    for (temperature, top_p), items in by_params.items():
        index = torch.tensor([row for row, _, _ in items], device=logits.device)
        seeds = torch.tensor([spec.seed for _, spec, _ in items], dtype=torch.int64, device=logits.device)
        drawn_at = [spec.offset + position - len(spec.forced) for _, spec, position in items]
        at = torch.tensor(drawn_at, dtype=torch.int64, device=logits.device)
        tokens, logprobs = sample(logits[index], seeds, at, temperature, top_p)
        for (_, spec, position), logprob in zip(items, logprobs.tolist()):
            RECORDS.setdefault(spec.id, Record()).logprobs[position] = logprob
        logits[index] = float("-inf")
        logits[index, tokens] = 0.0


class SeededSampler(V1Processor, V2Processor):
    """Both runners' processor interfaces over :func:`choose`.

    V1 (the CPU build): ``update_state`` reports batch slots with each request's live output
    list, ``apply(logits)``. V2 (the GPU default): ``add_request`` per request slot,
    ``apply(logits, ctx)`` with each logits row's slot and sequence position.
    """

    def __init__(self, _vllm_config: Any, *_runner_state: Any) -> None:
        self.slots: dict[int, tuple[Seeded, list[int]]] = {}

    @classmethod
    def validate_params(cls, sampling_params: VllmParams) -> None:
        validate(sampling_params)

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if batch_update is None:
            return
        for index in batch_update.removed:
            self.slots.pop(index, None)
        for index, params, _prompt, output in batch_update.added:
            self.add_request(index, params, output)
        for a, b, direction in batch_update.moved:
            first, second = self.slots.pop(a, None), self.slots.pop(b, None)
            if first is not None:
                self.slots[b] = first
            if direction == MoveDirectionality.SWAP and second is not None:
                self.slots[a] = second

    def add_request(self, req_idx: int, sampling_params: VllmParams, output: list[int] | None = None) -> bool:
        spec = Seeded.of(sampling_params)
        if spec is None:
            self.slots.pop(req_idx, None)
            return False
        self.slots[req_idx] = (spec, output if output is not None else [])
        return True

    def apply(self, logits: torch.Tensor, ctx: Any = None) -> torch.Tensor:
        if not self.slots:
            return logits
        if ctx is None:
            # V1: rows are slots; a row samples the token after those generated so far.
            rows = sorted(self.slots)
            specs = [self.slots[row][0] for row in rows]
            positions = [len(self.slots[row][1]) for row in rows]
        else:
            # V2: the row fed the token at sequence position p samples generated index p + 1 - prompt_len.
            slots, fed_at = ctx.expanded_idx_mapping.tolist(), ctx.pos.tolist()
            rows = [row for row, slot in enumerate(slots) if slot in self.slots]
            specs = [self.slots[slots[row]][0] for row in rows]
            positions = [fed_at[row] + 1 - spec.prompt_len for row, spec in zip(rows, specs)]
        choose(logits, rows, specs, positions)
        return logits


class ProofRecorder:
    """Methods vLLM adds to its worker (``worker_extension_cls``); ``self`` is that worker."""

    model_runner: Any

    def intellect_install(self) -> int:
        """Hook the model's logits layer; returns the hidden size."""
        model = self.model_runner.model
        model.logits_processor.register_forward_pre_hook(_keep_logit_rows)
        return int(model.config.hidden_size)

    def intellect_reload(self, directory: str) -> None:
        """Load a checkpoint directory's weights in place (vLLM's own reload), then redo the tied
        LM head's preparation: its weight is the embedding's, which the checkpoint holds under the
        embedding's name only, so the reload leaves the head's prepared copy (the CPU build packs
        one for its GEMM) stale."""
        model = self.model_runner.model
        tied = bool(getattr(model.config, "tie_word_embeddings", False))
        _quiet_expected_reload_warnings(tied)
        self.reload_weights(weights_path=directory)  # type: ignore[attr-defined]
        if tied:
            model.lm_head.quant_method.process_weights_after_loading(model.lm_head)

    def intellect_take(self, lengths: dict[str, int]) -> dict[str, tuple[list[float], bytes, list[int]]]:
        """For each request id and its completion length: its logprobs, its ``[length - 1, hidden]``
        bf16 states as raw bytes (plain data crosses vLLM's process boundary intact), and the
        positions missing from either. Every record is dropped, taken or not."""
        taken = {}
        for request, length in lengths.items():
            record = RECORDS.get(request, Record())
            wanted_states = range(max(length - 1, 0))
            missing = sorted(
                {i for i in range(length) if i not in record.logprobs} | {i for i in wanted_states if i not in record.hidden}
            )
            logprobs = [record.logprobs.get(i, 0.0) for i in range(length)]
            states = [record.hidden[i] for i in wanted_states if i in record.hidden]
            raw = torch.stack(states).view(torch.int16).numpy().tobytes() if states else b""
            taken[request] = (logprobs, raw, missing)
        RECORDS.clear()
        return taken


class _ExpectedReloadWarnings(logging.Filter):
    """vLLM's reload warns "Failed to load weights" for every layer the checkpoint holds nothing
    for. Two such layers are expected, and this filter drops only their warnings: rotary embeddings
    (their tables are computed, not stored) and, in a model with tied embeddings, the LM head (its
    weight is the embedding's, reloaded under that name and re-prepared by ``intellect_reload``)."""

    def __init__(self, tied: bool) -> None:
        super().__init__()
        self.expected = {"RotaryEmbedding", *(("ParallelLMHead",) if tied else ())}

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.getMessage().endswith(": Failed to load weights") and record.args and record.args[0] in self.expected)  # type: ignore[index]


def _quiet_expected_reload_warnings(tied: bool) -> None:
    logger = logging.getLogger("vllm.model_executor.model_loader.reload.layerwise")
    if not any(isinstance(f, _ExpectedReloadWarnings) for f in logger.filters):
        logger.addFilter(_ExpectedReloadWarnings(tied))
