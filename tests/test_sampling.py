"""The seeded sampler: a fixed, batch-independent noise, exact Gumbel-max draws, and replay."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from node.inference.vllm_backend import (
    SeededLogitsProcessor,
    VllmBackend,
    record_hidden_states,
    vllm_sampling_kwargs,
)
from shared.sampling import gumbel_noise, nucleus_mask, replay, sample
from shared.schemas import SamplingParams

pytestmark = pytest.mark.unit


def test_noise_is_fixed_and_independent_of_the_batch() -> None:
    alone = gumbel_noise(torch.tensor([7]), torch.tensor([3]), 50)
    batched = gumbel_noise(torch.tensor([1, 7, 9]), torch.tensor([0, 3, 3]), 50)
    assert torch.equal(alone[0], batched[1])
    assert not torch.equal(batched[0], batched[1]) and not torch.equal(batched[1], batched[2])
    # The documented formula, computed with Python integers: the torch int64 version must agree,
    # on every device, or validators would re-derive different tokens.
    for seed, position in ((0, 0), (12345, 17), (2**62 + 5, 4000)):
        got = gumbel_noise(torch.tensor([seed]), torch.tensor([position]), 6)[0]
        assert torch.allclose(got, torch.tensor([documented_noise(seed, position, t) for t in range(6)]), atol=1e-5)


def documented_noise(seed: int, position: int, token: int) -> float:
    mask = (1 << 64) - 1
    x = (seed * 0x9E3779B97F4A7C15 + position * 0xD1B54A32D192ED03 + token * 0x8CB92BA72F3D8DD7) & mask
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & mask
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & mask
    x = x ^ (x >> 31)
    u = ((x >> 40) + 0.5) / 2**24
    return -math.log(-math.log(u))


def test_noise_is_gumbel() -> None:
    g = gumbel_noise(torch.arange(4), torch.zeros(4, dtype=torch.long), 50_000)
    assert abs(g.mean().item() - 0.5772) < 0.02 and abs(g.std().item() - 1.2825) < 0.02


def test_draws_follow_the_tempered_distribution() -> None:
    logits = torch.tensor([1.0, 0.0, -1.0, 2.0])
    n = 20_000
    for temperature in (0.5, 1.0):
        tokens, _ = sample(logits.expand(n, 4), torch.arange(n), torch.zeros(n, dtype=torch.long), temperature)
        freq = torch.bincount(tokens, minlength=4) / n
        assert torch.allclose(freq, (logits / temperature).softmax(-1), atol=0.015)


def test_top_p_and_greedy() -> None:
    logits = torch.tensor([[1.0, 0.0, -1.0, 2.0]])
    assert nucleus_mask(logits, 0.7).tolist() == [[True, False, False, True]]
    assert nucleus_mask(logits, 0.01).tolist() == [[False, False, False, True]]
    n = 5000
    tokens, _ = sample(logits.expand(n, 4), torch.arange(n), torch.zeros(n, dtype=torch.long), 1.0, top_p=0.7)
    assert set(tokens.tolist()) == {0, 3}
    tokens, logprobs = sample(logits.expand(3, 4), torch.arange(3), torch.zeros(3, dtype=torch.long), 0.0)
    assert tokens.tolist() == [3, 3, 3]
    assert torch.allclose(logprobs, logits.log_softmax(-1)[0, 3].expand(3))


def test_replay_rederives_each_token() -> None:
    torch.manual_seed(0)
    logits = torch.randn(30, 100)
    drawn = [int(sample(logits[i : i + 1], torch.tensor([99]), torch.tensor([i]), 0.8, 0.95)[0]) for i in range(30)]
    assert replay(logits, 99, 0.8, 0.95).tolist() == drawn
    assert replay(logits, 98, 0.8, 0.95).tolist() != drawn


def test_vllm_pure_parts() -> None:
    params = SamplingParams(temperature=0.7, top_p=0.9, max_tokens=12, stop_on_eos=True)
    kwargs = vllm_sampling_kwargs(params, eos_token_id=2)
    assert kwargs["temperature"] == 0.0 and kwargs["max_tokens"] == 12 and kwargs["stop_token_ids"] == [2]
    assert vllm_sampling_kwargs(params.model_copy(update={"stop_on_eos": False}), 2)["ignore_eos"] is True

    torch.manual_seed(1)
    logits = torch.randn(6, 40)
    processor = SeededLogitsProcessor(seed=5, params=params)
    generated: list[int] = []
    for step in range(6):
        generated.append(int(processor(generated, logits[step]).argmax()))
    assert generated == replay(logits, 5, 0.7, 0.9).tolist()
    expected = (logits / 0.7).log_softmax(-1).gather(-1, torch.tensor(generated)[:, None])[:, 0]
    assert torch.allclose(torch.tensor(processor.logprobs), expected)



def _group(processor: SeededLogitsProcessor | None, seq_outputs: dict[int, int], sample_indices: list[int]) -> SimpleNamespace:
    """A stand-in for one of vLLM's ``SequenceGroupToSample`` (vLLM cannot be installed here)."""
    return SimpleNamespace(
        seq_ids=list(seq_outputs),
        sample_indices=sample_indices,
        seq_data={i: SimpleNamespace(get_output_len=lambda n=n: n) for i, n in seq_outputs.items()},
        sampling_params=SimpleNamespace(logits_processors=[processor] if processor else None),
    )


def test_vllm_hidden_states_follow_their_sequences_through_batching_and_recompute() -> None:
    params = SamplingParams(temperature=1.0, top_p=1.0, max_tokens=8)
    a, b = SeededLogitsProcessor(1, params), SeededLogitsProcessor(2, params)
    states = torch.arange(24.0).reshape(8, 3)
    # Step 1: a and b are fresh prompts (their rows commit nothing); a third request has no processor.
    step1 = SimpleNamespace(
        selected_token_indices=torch.tensor([2, 5, 7]),
        seq_groups=[_group(a, {10: 0}, [0]), _group(None, {11: 0}, [1]), _group(b, {12: 0}, [2])],
    )
    record_hidden_states(states, step1)
    assert a.hidden == {} and b.hidden == {}
    # Step 2: decode rows in another order; b carries prompt-logprob rows before its sample row.
    step2 = SimpleNamespace(
        selected_token_indices=torch.tensor([0, 1, 2, 3]),
        seq_groups=[_group(b, {12: 1}, [2]), _group(a, {10: 1}, [3])],
    )
    record_hidden_states(states, step2)
    assert a.hidden[0].tolist() == [9, 10, 11] and b.hidden[0].tolist() == [6, 7, 8]
    # a is preempted and recomputed as a prompt after two more tokens: its row is position 2.
    step3 = SimpleNamespace(selected_token_indices=torch.tensor([4]), seq_groups=[_group(a, {10: 3}, [0])])
    record_hidden_states(states, step3)
    with pytest.raises(ValueError, match=r"positions \[1\]"):
        a.take_hidden(4, 3)
    a.record_hidden(1, torch.zeros(3))
    assert a.take_hidden(4, 3).tolist() == [[9, 10, 11], [0, 0, 0], [12, 13, 14]]
    assert b.take_hidden(1, 3).shape == (0, 3) and b.take_hidden(2, 3).dtype == torch.bfloat16


def test_vllm_backend_without_the_extra_says_how_to_install_it() -> None:
    try:
        import vllm  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match=r"\[vllm\] extra"):
            VllmBackend("shared/assets/tiny-arith", eos_token_id=2)
    else:
        pytest.skip("vLLM is installed: the engine itself is exercised on GPU nodes")
