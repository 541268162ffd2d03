"""The node's KV cache: a step writes one position into a buffer with room to spare, and what the model reads is
exactly what transformers' concatenating cache gives it, on every family, as rows finish apart."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import DynamicCache

from intellect_protocol.shared.inference import Turn
from intellect_protocol.shared.kv_cache import BufferedLayer
from intellect_protocol.shared.models import cache_keyword, load_model
from intellect_protocol.shared.schemas import SamplingParams
from intellect_protocol.shared.torch_backend import TorchBackend
from tests.families import FAMILIES, build

pytestmark = pytest.mark.unit

torch.set_num_threads(1)


def _steps(batch: int, first: int, then: int, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """A prompt's keys and values ``[batch, 2, first, 4]`` (values' head_dim 3), then ``then`` single positions."""
    generator = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(batch, 2, n, 4, generator=generator), torch.randn(batch, 2, n, 3, generator=generator))
        for n in [first] + [1] * then
    ]


def test_a_call_holds_one_buffer_of_its_capacity_and_every_step_writes_into_it() -> None:
    layer, reference = BufferedLayer(capacity=13), DynamicCache()
    buffers = []
    for keys, values in _steps(batch=3, first=5, then=8):
        got = layer.update(keys, values)
        want = reference.update(keys, values, 0)
        assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))
        buffers.append((got[0].data_ptr(), layer._buffers[0].shape[-2]))  # type: ignore[index]
    assert buffers == [buffers[0]] * 9 and buffers[0][1] == 13


def test_a_capacity_too_small_costs_copies_but_never_a_wrong_read() -> None:
    layer, reference = BufferedLayer(capacity=6), DynamicCache()
    for keys, values in _steps(batch=2, first=5, then=4):
        got = layer.update(keys, values)
        want = reference.update(keys, values, 0)
        assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))
    assert layer._buffers is not None and layer._buffers[0].shape[-2] == 9


def test_rows_that_leave_are_compacted_in_the_same_buffers_and_the_kept_rows_read_as_before() -> None:
    layer, reference = BufferedLayer(capacity=40), DynamicCache()
    steps = _steps(batch=4, first=3, then=6)
    for keys, values in steps[:3]:
        layer.update(keys, values)
        reference.update(keys, values, 0)
    before = layer._buffers[0].data_ptr()  # type: ignore[index]
    keep = torch.tensor([2, 0])
    layer.batch_select_indices(keep)
    reference.batch_select_indices(keep)
    for keys, values in steps[3:]:
        got = layer.update(keys[keep], values[keep])
        want = reference.update(keys[keep], values[keep], 0)
        assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))
    assert layer._buffers is not None and layer._buffers[0].shape[0] == 2 and layer._buffers[0].data_ptr() == before


@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_node_decodes_exactly_as_with_transformers_own_cache(family: str, tmp_path: Path) -> None:
    """Tokens, logprobs and hidden states bit for bit, past Gemma 3's sliding window, rows leaving at their limits."""
    model, tokenizer = load_model(build(family, tmp_path))
    prompts = [tokenizer.encode(text) for text in ("12+34=", "1234+5678=", "7+8=", "99+1=")]
    turn = Turn(offsets=[0, 3, 0, 5], carried=[0, 0, 0, 0], limits=[48, 9, 30, 1], ended=lambda tokens: False)
    params = SamplingParams(temperature=1.0, max_tokens=48, stop_on_eos=False)
    results, layers = [], []
    keyword = cache_keyword(model)
    hook = model.register_forward_pre_hook(lambda _, args, kwargs: layers.append(kwargs[keyword].layers[:]), with_kwargs=True)
    try:
        for kv_cache in (None, lambda _: DynamicCache()):
            options = {} if kv_cache is None else {"kv_cache": kv_cache}
            backend = TorchBackend(model, tokenizer.eos_token_id, tokenizer.pad_token_id, **options)  # type: ignore[arg-type]
            results.append(backend.generate(prompts, [1, 2, 3, 4], params, turn))
    finally:
        hook.remove()
    buffered, concatenating = results
    assert [len(c.tokens) for c in buffered] == [48, 9, 30, 1]
    # The node's own backend decodes on the buffered cache (its steps after the prompt's pass), the other does not.
    steps = len(layers) // 2
    assert all(isinstance(layer, BufferedLayer) for step in layers[1:steps] for layer in step) and layers[1]
    assert not any(isinstance(layer, BufferedLayer) for step in layers[steps:] for layer in step)
    for mine, theirs in zip(buffered, concatenating, strict=True):
        assert mine.tokens == theirs.tokens and mine.logprobs == theirs.logprobs
        assert torch.equal(mine.hidden, theirs.hidden)
