"""Generation, proofs and validator prefill on the tiny model and a larger random-init model.

For each model, in one run: generation tokens/s (torch backend, batched, KV cache), TOPLOC
proof building per token, proof overhead as a percentage of generation time, and one
validator prefill per sequence relative to generation. Then TOPLOC alone at hidden size
4096 (bf16), against its per-token targets. One torch thread throughout.

    python bench/inference.py [--batch 8] [--tokens 64]
"""

from __future__ import annotations

import argparse
import random
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from node.inference.torch_backend import TorchBackend
from shared.environments.arithmetic import make_problem
from shared.inference import prefill
from shared.models import load_model
from shared.schemas import SamplingParams
from shared.tiny_model import prompt_ids
from shared.toploc import build_proofs, build_proofs_batch, verify_proofs


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=8, help="sequences generated together")
    parser.add_argument("--tokens", type=int, default=64, help="tokens generated per sequence")
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


if __name__ == "__main__":
    main()
