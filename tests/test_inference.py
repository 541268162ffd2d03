"""Generation with proofs, end to end on the shipped tiny model: generate, prove, prefill,
verify; a swapped model fails; every sampled token re-derives from its seed."""

from __future__ import annotations

import random
import threading

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from intellect_protocol.shared.environments.arithmetic import held_out_problems, make_problem, reward
from intellect_protocol.shared.evaluation import Stopped
from intellect_protocol.shared.inference import prefill
from intellect_protocol.shared.models import TINY_MODEL_DIR, load_model
from intellect_protocol.shared.sampling import replay
from intellect_protocol.shared.schemas import SamplingParams
from intellect_protocol.shared.tiny_model import MAX_LEN, greedy_accuracy, greedy_completions, prompt_ids
from intellect_protocol.shared.toploc import build_proofs, rollout_passes, verify_proofs
from intellect_protocol.shared.torch_backend import TorchBackend

pytestmark = pytest.mark.unit

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tiny():
    model, tokenizer = load_model(TINY_MODEL_DIR)
    return model, tokenizer, TorchBackend(model, tokenizer.eos_token_id, tokenizer.pad_token_id)


@pytest.fixture(scope="module")
def prompts(tiny):
    rng = random.Random(7)
    return [make_problem(rng) for _ in range(6)]


def test_shipped_model_loads_offline_and_solves_some(tiny, prompts) -> None:
    model, tokenizer, backend = tiny
    assert 500_000 <= sum(p.numel() for p in model.parameters()) <= 5_000_000
    rng = random.Random(99)
    problems = [make_problem(rng) for _ in range(48)]
    outs = backend.generate(
        [prompt_ids(tokenizer, p) for p, _ in problems], list(range(48)), SamplingParams(temperature=0, max_tokens=48)
    )
    accuracy = sum(reward(tokenizer.decode(o.tokens, skip_special_tokens=True), a) for o, (_, a) in zip(outs, problems)) / 48
    assert 0.3 <= accuracy <= 0.95  # learned, with room left for RL


def test_generate_prove_prefill_verify(tiny, prompts) -> None:
    model, tokenizer, backend = tiny
    params = SamplingParams(temperature=1.0, top_p=1.0, max_tokens=48)
    ids = [prompt_ids(tokenizer, p) for p, _ in prompts]
    seeds = [1000 + i for i in range(len(ids))]
    completions = backend.generate(ids, seeds, params)

    other = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(TINY_MODEL_DIR)).eval()
    for prompt, seed, completion in zip(ids, seeds, completions):
        assert completion.finish_reason in ("stop", "length")
        if completion.finish_reason == "stop":
            assert completion.tokens[-1] == tokenizer.eos_token_id
        else:
            assert len(completion.tokens) == params.max_tokens
        assert completion.hidden.shape == (len(completion.tokens) - 1, model.config.hidden_size)
        proofs = build_proofs(completion.hidden)

        hidden, logits = prefill(model, prompt, completion.tokens)
        assert rollout_passes(verify_proofs(hidden, proofs))
        assert replay(logits, seed, params.temperature, params.top_p).tolist() == completion.tokens
        recomputed = logits.log_softmax(-1).gather(-1, torch.tensor(completion.tokens)[:, None])[:, 0]
        assert torch.allclose(recomputed, torch.tensor(completion.logprobs), atol=1e-4)

        swapped_hidden, swapped_logits = prefill(other, prompt, completion.tokens)
        assert not rollout_passes(verify_proofs(swapped_hidden, proofs))
        assert replay(swapped_logits, seed, params.temperature).tolist() != completion.tokens

        # Proven against another problem's prompt: TOPLOC fails.
        other_prompt = prompt_ids(tokenizer, make_problem(random.Random(seed))[0])
        changed_hidden, _ = prefill(model, other_prompt, completion.tokens)
        assert not rollout_passes(verify_proofs(changed_hidden, proofs))
        # One digit changed: too small for this 128-wide model's top-k to notice, but the
        # replayed samples (and, in the validator, the assignment check) do.
        one_digit = (
            prompt[:-2] + [tokenizer.convert_tokens_to_ids(str((int(tokenizer.decode(prompt[-2])) + 5) % 10))] + prompt[-1:]
        )
        _, one_digit_logits = prefill(model, one_digit, completion.tokens)
        assert replay(one_digit_logits, seed, params.temperature).tolist() != completion.tokens


def test_batch_composition_and_padding_do_not_change_samples(tiny) -> None:
    _, tokenizer, backend = tiny
    params = SamplingParams(temperature=1.0, max_tokens=20)
    short = prompt_ids(tokenizer, "12+34:")
    long = prompt_ids(tokenizer, "123+456:")
    alone = backend.generate([short], [5], params)[0]
    batched = backend.generate([long, short, long], [1, 5, 2], params)[1]
    assert batched.tokens == alone.tokens
    assert torch.allclose(torch.tensor(batched.logprobs), torch.tensor(alone.logprobs), atol=1e-4)
    assert rollout_passes(verify_proofs(batched.hidden, build_proofs(alone.hidden)))


def test_a_finished_row_leaves_the_decode_batch_and_the_others_are_unchanged(tiny) -> None:
    """Long reasoning ends anywhere from one to twice the shortest: a row kept in the batch to the longest would cost
    what a live one does at every step."""
    model, tokenizer, backend = tiny
    prompts = [prompt_ids(tokenizer, p) for p in ("12+34:", "123+456:", "5+7:")]
    seeds = [11, 12, 13]
    alone = [backend.generate([p], [s], SamplingParams(temperature=1.0, max_tokens=30))[0] for p, s in zip(prompts, seeds)]
    rows: list[int] = []
    hook = model.register_forward_pre_hook(lambda _, args, kwargs: rows.append(kwargs["input_ids"].shape[0]), with_kwargs=True)
    try:
        together = backend.generate(prompts, seeds, SamplingParams(temperature=1.0, max_tokens=30))
    finally:
        hook.remove()
    lengths = sorted(len(c.tokens) for c in together)
    assert lengths[0] < lengths[-1], lengths  # rows that finish apart, or nothing is tested
    # The prompts' pass, then one step a token of the longest but its last, each fed the rows not finished by it.
    assert rows == [3] + [sum(len(c.tokens) > step for c in together) for step in range(1, lengths[-1])]
    for batched, single in zip(together, alone):
        assert batched.tokens == single.tokens and batched.finish_reason == single.finish_reason
        assert batched.hidden.shape == single.hidden.shape
        assert rollout_passes(verify_proofs(batched.hidden, build_proofs(single.hidden)))


def test_length_limit_and_eos_switch(tiny) -> None:
    _, tokenizer, backend = tiny
    out = backend.generate([prompt_ids(tokenizer, "123+456:")], [3], SamplingParams(temperature=0, max_tokens=5))[0]
    assert len(out.tokens) == 5 and out.finish_reason == "length" and out.hidden.shape[0] == 4
    out = backend.generate(
        [prompt_ids(tokenizer, "123+456:")], [3], SamplingParams(temperature=0, max_tokens=50, stop_on_eos=False)
    )[0]
    assert len(out.tokens) == 50 and out.finish_reason == "length"
    with pytest.raises(ValueError):
        backend.generate([[]], [1], SamplingParams())


def test_the_kv_cache_is_passed_by_the_installed_transformers_own_name(tiny) -> None:
    """Generation and chunked prefill run a KV cache through the model without a deprecation warning
    (transformers renamed ``past_key_values`` to ``cache``; the old name goes in 5.40), and the cache is
    really used: tokens generated step by step score exactly as one prefill of the whole sequence."""
    import warnings

    from intellect_protocol.shared.inference import prefill_batch

    model, tokenizer, backend = tiny
    prompt = prompt_ids(tokenizer, "12+34=")
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        warnings.simplefilter("error", DeprecationWarning)
        done = backend.generate([prompt], [5], SamplingParams(temperature=1.0, max_tokens=12, stop_on_eos=False))[0]
        whole, chunked = (prefill_batch(model, [prompt], [done.tokens], chunk=n)[0].logits() for n in (None, 3))
    chosen = torch.log_softmax(whole, -1)[torch.arange(len(done.tokens)), done.tokens]
    assert torch.allclose(chosen, torch.tensor(done.logprobs), atol=1e-4)
    assert torch.allclose(whole, chunked, atol=1e-4)


def test_held_out_accuracy_decodes_as_argmax_without_a_cache_and_gives_up_when_stopped(tiny) -> None:
    model, tokenizer, _ = tiny
    problems = held_out_problems()[:40]
    ids = torch.tensor([prompt_ids(tokenizer, p) for p, _ in problems])
    width = ids.shape[1]
    with torch.inference_mode():  # the reference: the whole prefix re-read for every token
        for _ in range(MAX_LEN - width):
            ids = torch.cat([ids, model(input_ids=ids).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    texts = [text.split(tokenizer.eos_token)[0] for text in tokenizer.batch_decode(ids[:, width:])]
    solved = sum(reward(text, answer) for text, (_, answer) in zip(texts, problems)) / len(problems)
    assert 0 < solved < 1 and greedy_accuracy(model, tokenizer, problems) == solved

    stop = threading.Event()
    stop.set()
    with pytest.raises(Stopped):
        greedy_accuracy(model, tokenizer, problems, stop)


def test_greedy_completions_of_unequal_prompts_are_each_prompts_own(tiny) -> None:
    model, tokenizer, _ = tiny
    prompts = ["12+34:", "123+456:", "1+2:", "4321+8765:"]
    together = greedy_completions(model, tokenizer, prompts)
    assert together == [greedy_completions(model, tokenizer, [p])[0] for p in prompts]
    assert len(set(together)) == len(prompts) and all(text for text in together)
