"""Peak memory of a node's and a validator's work at a real vocabulary and completion length.

A Qwen3-shaped model with Qwen3-0.6B's vocabulary (151,936 tokens) and width (hidden 1024), two layers,
random weights and a tied head, is made here (``--hidden 256`` is the harsher case: the same vocabulary
over a quarter of the weights).
One node process generates a ``--tokens``-token completion with the torch backend and builds its
TOPLOC proofs; one validator process checks that completion (one prefill, the proofs, the sampling
check); each in a fresh process, its peak resident memory read from the kernel's high-water mark
(reset after the model is loaded). The baseline, in the same run, is the validator as it was: the
model's logits for the whole completion at once, ``[tokens, vocab]`` in float32.

Goal (issue 29): each role's peak at most 1.5x the weights plus the KV cache of its sequence.

    python bench/memory.py [--vocab 151936] [--tokens 4096] [--hidden 1024]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from intellect_protocol.node.fit import kv_cache_bytes  # noqa: E402

PROMPT = 64


def resident() -> tuple[int, int]:
    """(current, peak) resident bytes of this process."""
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]) * 1024, int(fields["VmHWM"].split()[0]) * 1024


def reset_peak() -> int:
    """Set the kernel's peak-RSS mark to the current RSS (``clear_refs`` 5); returns that RSS."""
    Path("/proc/self/clear_refs").write_text("5")
    return resident()[0]


def build(directory: Path, vocab: int, hidden: int) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(
        "qwen3",
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
        eos_token_id=vocab - 1,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(directory)


def measure(role: str, directory: Path, tokens: int) -> dict[str, float]:
    """Run one role's work on the saved model in this process; its peak above the loaded model's RSS."""
    from transformers import AutoModelForCausalLM

    from intellect_protocol.shared.inference import prefill_batch
    from intellect_protocol.shared.rollout_file import Rollout
    from intellect_protocol.shared.schemas import SamplingParams
    from intellect_protocol.shared.tolerances import TOLERANCES
    from intellect_protocol.shared.toploc import build_proofs_batch, verify_proofs
    from intellect_protocol.shared.torch_backend import TorchBackend
    from intellect_protocol.validator.sampling_check import row_sampling

    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(directory).eval()
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    prompt = list(range(1, PROMPT + 1))
    params = SamplingParams(temperature=1.0, max_tokens=tokens, stop_on_eos=False)
    work = directory / "completion.json"
    with torch.inference_mode():
        model(torch.tensor([prompt[:4]]))  # the allocator's and the kernels' first-use memory belongs to neither side
    before = reset_peak()
    started = time.perf_counter()
    if role == "node":
        completion = TorchBackend(model, eos_token_id=model.config.eos_token_id, pad_token_id=0).generate([prompt], [7], params)[
            0
        ]
        proofs = build_proofs_batch([completion.hidden])[0]
        work.write_text(json.dumps({"tokens": completion.tokens, "logprobs": completion.logprobs, "proofs": proofs.hex()}))
    else:
        done = json.loads(work.read_text())
        row = Rollout(
            task_id="t",
            run_id="r",
            policy_step=0,
            prompt_id="p",
            prompt_tokens=prompt,
            completion_tokens=done["tokens"],
            logprobs=done["logprobs"],
            finish_reason="length",
            reward=0.0,
            task_reward=0.0,
            length_penalty=0.0,
            target_length=0,
            seed=7,
            proofs=bytes.fromhex(done["proofs"]),
        )
        prefilled = prefill_batch(model, [prompt], [row.completion_tokens])[0]
        if role == "validator":
            blocks = prefilled.blocks()
        else:  # the previous validator: the whole completion's logits at once, as the model's forward made them
            with torch.inference_mode():
                whole = model(torch.tensor([prompt + row.completion_tokens[:-1]])).logits[0, PROMPT - 1 :].float()
            blocks = iter([(0, whole)])
        judged = row_sampling(row, blocks, 1.0, 1.0, TOLERANCES["float32"])
        proofs_ok = all(c.ok for c in verify_proofs(prefilled.hidden, row.proofs))
        if judged.forged or not proofs_ok:
            raise SystemExit(f"{role}: honest work failed its check ({judged.forged or 'proofs'})")
    seconds = time.perf_counter() - started
    peak = resident()[1]
    kv = kv_cache_bytes(model.config.to_dict(), sequences=1, tokens=PROMPT + tokens, dtype="float32")
    return {"weights": weights, "kv": kv, "extra": peak - before, "seconds": seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vocab", type=int, default=151_936)
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--measure", choices=["node", "validator", "previous-validator"], help=argparse.SUPPRESS)
    parser.add_argument("--model", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args.measure, args.model, args.tokens)))
        return

    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp) / "qwen3-151936"
        build(directory, args.vocab, args.hidden)
        print(
            f"Qwen3-shaped, vocab {args.vocab:,}, hidden {args.hidden}, {PROMPT}-token prompt, {args.tokens}-token completion, fp32, 1 thread"
        )
        results = {}
        for role in ("node", "validator", "previous-validator"):
            command = [sys.executable, __file__, "--measure", role, "--model", str(directory), "--tokens", str(args.tokens)]
            out = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
            if out.returncode < 0 and role == "previous-validator":
                # Its whole-completion logits and their temporaries take about 19 GB at the defaults.
                print(f"{role:<19} killed by {signal.Signals(-out.returncode).name} (out of memory, most likely): no ratio")
                return
            if out.returncode != 0:
                why = signal.Signals(-out.returncode).name if out.returncode < 0 else f"exit {out.returncode}"
                raise SystemExit(f"{role} failed ({why}):\n{out.stderr[-3000:]}")
            results[role] = r = json.loads(out.stdout.strip().splitlines()[-1])
            weights, kv = r["weights"], r["kv"]
            peak = weights + r["extra"]
            print(
                f"{role:<19} peak {peak / 2**20:8.1f} MiB = weights {weights / 2**20:6.1f} + {r['extra'] / 2**20:8.1f} MiB "
                f"({(peak - kv) / weights:5.2f}x the weights beyond the {kv / 2**20:.1f} MiB KV cache; goal <= 1.5)  {r['seconds']:6.1f} s"
            )
    new, old = results["validator"], results["previous-validator"]
    print(
        f"validator peak above its weights, previous / now: {old['extra'] / 2**20:.1f} / {new['extra'] / 2**20:.1f} MiB = {old['extra'] / new['extra']:.1f}x"
    )


if __name__ == "__main__":
    main()
