"""False rejects and forgers' gain of the validator's checks under real numerics.

Honest nodes (the node's own code, torch backend, fp32 and bf16) generate 16-row tasks at
several temperatures up to the run's token limit; the real validator checks every file, with
prefill batch sizes cycling through 1, 4, 16 and 64. Forgers then rewrite honest generations:
near-tie cherry-picking (the first improving near-tie, or every one), logprobs moved (+0.019 on
every token, +0.8 or -89 on one), rows sampled with another seed or temperature. The same run
measures the previous check as the baseline: an fp32 validator with a fixed 0.05 score margin and
a 0.02 mean logprob bound.

Any model can be measured (``--model DIR``, with ``--backend vllm`` for vLLM nodes): a model other
than the shipped one is first calibrated as a run on it would be (``--calibrate-rows`` honest rows per
numerics, :mod:`validator.calibration`), and the validator judges by those tolerances; the shipped
model's calibration is the floors themselves.

Prints, per configuration: honest rows and tasks rejected (goal 0 of >= 5,000 rows), rows kept out
of training, and the validator's tokens/s over the node's (generation, proofs and file); per
forgery: files accepted, files whose forged rows reached training (goal 0); and for the
cherry-pickers the reward per 1,000 rows that reached the trainer beyond an honest node's on the
same tasks (goal: not above 0). The last line compares honest bf16 rows rejected by the previous
check and by this one.

With ``--widened F`` every bound is F times the floor's: what forgers get through at the widest bounds the
admin API lets an operate-scope token set (4x; wider needs the admin scope and is shown on the run's page).

    python bench/verification.py [--rows 5000] [--forged-tasks 40] [--model DIR] [--backend vllm] [--widened 4]
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from _tasks import arithmetic_task
from pydantic import TypeAdapter

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from intellect_protocol.devnet.numerics_forgeries import cherry_pick, resampled, shifted_logprobs  # noqa: E402
from intellect_protocol.node.work import Generated, backend_for, finish, generate, torch_backend_for  # noqa: E402
from intellect_protocol.shared.environments.registry import get_environment  # noqa: E402
from intellect_protocol.shared.inference import prefill_batch  # noqa: E402
from intellect_protocol.shared.models import encode_prompt, load_model  # noqa: E402
from intellect_protocol.shared.rollout_file import read_rollouts  # noqa: E402
from intellect_protocol.shared.sampling import sampling_scores, token_logprobs  # noqa: E402
from intellect_protocol.shared.schemas import DEFAULT_MODEL, SamplingParams, TaskSpec  # noqa: E402
from intellect_protocol.shared.tolerances import TOLERANCES as FLOORS  # noqa: E402
from intellect_protocol.shared.tolerances import Calibration, widening  # noqa: E402
from intellect_protocol.validator.calibration import calibration_file, measure  # noqa: E402
from intellect_protocol.validator.checks import CheckSettings, Context, Verdict, validate  # noqa: E402

torch.set_num_threads(1)
ENVIRONMENT = get_environment("arithmetic")
PROBLEMS = {p.id: p for p in ENVIRONMENT.problems()}
BATCHES = (1, 4, 16, 64)
MODEL_NAME = DEFAULT_MODEL
"""The model every role runs (``--model``)."""
BACKEND = "torch"
"""The honest nodes' engine (``--backend``)."""
TOLERANCES: dict | None = None
"""The run's calibration (None: the shipped model's floors)."""
MODEL: Any
TOKENIZER: Any
"""``MODEL_NAME`` loaded once, as the validator holds it (fp32)."""


def close_engine() -> None:
    from intellect_protocol.shared.vllm_backend import close_engine as close

    close()


def make_task(seed: int, temperature: float, max_tokens: int) -> TaskSpec:
    return arithmetic_task(seed, MODEL_NAME, temperature, max_tokens, tolerances=TOLERANCES)


def check(data: bytes, task: TaskSpec, batch: int) -> Verdict:
    ctx = Context(task, hashlib.sha256(data).hexdigest(), 0, 0, MODEL, TOKENIZER, ENVIRONMENT, PROBLEMS)
    return validate(data, ctx, CheckSettings(prefill_batch=batch))


def previous_check(data: bytes, task: TaskSpec) -> bool:
    """The check before this one: fp32 prefill, a fixed 0.05 margin, a 0.02 mean logprob bound."""
    rollouts = read_rollouts(data)
    params = task.sampling
    states = prefill_batch(MODEL, [r.prompt_tokens for r in rollouts], [r.completion_tokens for r in rollouts])
    for r, row in zip(rollouts, states):
        logits = row.logits()
        tokens = torch.tensor(r.completion_tokens)
        n = len(tokens)
        scores = sampling_scores(logits, torch.full((n,), r.seed), torch.arange(n), params.temperature, params.top_p)
        if (scores.gather(-1, tokens[:, None])[:, 0] < scores.max(-1).values - 0.05).any():
            return False
        if float((token_logprobs(logits, tokens, params.temperature) - torch.tensor(r.logprobs)).abs().mean()) > 0.02:
            return False
    return True


def trained_reward(data: bytes, verdict: Verdict) -> float:
    if not verdict.accepted:
        return 0.0
    return sum(r.reward for i, r in enumerate(read_rollouts(data)) if i not in set(verdict.untrained_rows))


def calibrate(dtypes: list[str], rows: int, max_tokens: int) -> dict:
    """The run's tolerances, measured on its model as ``intellect-validator calibrate`` measures them."""
    prompts = [encode_prompt(TOKENIZER, p.prompt) for p in list(PROBLEMS.values())[:rows]]
    results = []
    for dtype in dtypes:
        backend = None if BACKEND == "torch" else backend_for(MODEL_NAME, "vllm", dtype)[0]
        m = measure(MODEL, TOKENIZER, prompts, dtype, SamplingParams(temperature=1.0, max_tokens=max_tokens), backend)
        print(
            f"  calibrated {m.numerics}: {m.rows} rows, {m.deviations} tokens off the seeded draw (largest gap {m.max_gap:.3g}), "
            f"largest logprob error {m.logprob_max_error:.3g}; the floors would reject {m.rejected_rows}",
            flush=True,
        )
        results.append(m)
    return TypeAdapter(Calibration).validate_python(calibration_file(MODEL_NAME, 2.0, results)["tolerances"])


def widened(dtypes: list[str], factor: float) -> Calibration:
    """The floor of each dtype with every bound ``factor`` times wider (a count from at least 1)."""
    calibration = {}
    for dtype in dtypes:
        floor = FLOORS[dtype]
        wider = {k: factor * max(v, 1) if k == "outliers" else factor * v for k, v in floor.model_dump().items()}
        calibration[f"{BACKEND}/{dtype}"] = floor.widened(
            {k: min(v, 1.0) if k == "nucleus_mass" else v for k, v in wider.items()}
        )
    return calibration


def honest(dtype: str, temperature: float, rows: int, max_tokens: int, first_seed: int) -> dict[str, float]:
    tasks = rejected_rows = rejected_tasks = untrained = previous_rejected = tokens = 0
    node_s = validator_s = 0.0
    started = time.perf_counter()
    while tasks * 16 < rows:
        task = make_task(first_seed + tasks, temperature, max_tokens)
        begun = time.perf_counter()
        data = finish(generate(task, BACKEND, dtype)).data
        checked = time.perf_counter()
        verdict = check(data, task, BATCHES[tasks % len(BATCHES)])
        node_s, validator_s = node_s + checked - begun, validator_s + time.perf_counter() - checked
        tokens += sum(len(r.completion_tokens) for r in read_rollouts(data))
        if not verdict.accepted:
            rejected_tasks += 1
            rejected_rows += 16
            print(f"    rejected: {verdict.reason[:200]}", flush=True)
        untrained += len(verdict.untrained_rows)
        previous_rejected += 0 if previous_check(data, task) else 16
        tasks += 1
    return {
        "rows": tasks * 16,
        "tasks": tasks,
        "rejected_rows": rejected_rows,
        "rejected_tasks": rejected_tasks,
        "untrained": untrained,
        "previous_rejected_rows": previous_rejected,
        "node_tokens_per_s": tokens / node_s,
        "validator_tokens_per_s": tokens / validator_s,
        "s": time.perf_counter() - started,
    }


def forgeries(dtype: str) -> dict[str, Callable[[Generated], bytes]]:
    model, eos = torch_backend_for(MODEL_NAME, dtype)[0].model, TOKENIZER.eos_token_id
    return {
        "cherry-pick (first improving near-tie)": lambda g: cherry_pick(g, model, eos)[0],
        "cherry-pick (every near-tie toward higher reward)": lambda g: cherry_pick(g, model, eos, every=True)[0],
        "logprobs +0.019 on every token": lambda g: shifted_logprobs(g, 0.019, every_token=True),
        "logprob +0.8 on one token a row": lambda g: shifted_logprobs(g, 0.8, every_token=False),
        "logprob -89 on one token a row": lambda g: shifted_logprobs(g, -89.0, every_token=False),
        "another seed": lambda g: resampled(g, model, eos, seed_offset=7),
        "another temperature (1.3 for 1.0)": lambda g: resampled(g, model, eos, temperature=1.3),
    }


def forged_rows(data: bytes, honest_data: bytes, logprobs: bool) -> set[int]:
    """Rows whose tokens (or, for logprob forgeries, logprobs) differ from the honest generation's.
    Tokens alone for the others: re-proving recomputes logprobs, which moves them by numerics."""
    pairs = zip(read_rollouts(data), read_rollouts(honest_data))
    if logprobs:
        return {i for i, (a, b) in enumerate(pairs) if max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) > 1e-6}
    return {i for i, (a, b) in enumerate(pairs) if a.completion_tokens != b.completion_tokens}


def forged(dtype: str, tasks: int, max_tokens: int) -> None:
    for name, forge in forgeries(dtype).items():
        accepted = leaked = files = rows = 0
        gain = steered_gain = 0.0
        for i in range(tasks):
            task = make_task(50_000 + i, 1.0, max_tokens)
            generated = generate(task, BACKEND, dtype)
            honest_data = finish(generated).data
            data = forge(generated)
            changed = forged_rows(data, honest_data, logprobs=name.startswith("logprob"))
            if not changed:
                continue  # nothing to forge in this task (no near-tie improved the reward)
            files += 1
            rows += 16
            verdict = check(data, task, BATCHES[i % len(BATCHES)])
            accepted += verdict.accepted
            leaked += bool(verdict.accepted and changed - set(verdict.untrained_rows))
            if name.startswith("cherry"):
                gain += trained_reward(data, verdict) - trained_reward(honest_data, check(honest_data, task, 16))
                steered_gain += sum(r.reward for r in read_rollouts(data)) - sum(r.reward for r in read_rollouts(honest_data))
        line = f"  {dtype:8s} {name:52s} files {files:3d}  accepted {accepted:3d}  forged rows trained in {leaked:3d}"
        if name.startswith("cherry") and rows:
            line += f"  reward gain per 1,000 rows: {1000 * gain / rows:+.1f} reaching the trainer ({1000 * steered_gain / rows:+.1f} claimed)"
        print(line, flush=True)


def main() -> int:
    global MODEL_NAME, BACKEND, TOLERANCES, MODEL, TOKENIZER
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=5000, help="honest rows per configuration")
    parser.add_argument("--forged-tasks", type=int, default=40, help="16-row tasks per forgery")
    parser.add_argument("--max-tokens", type=int, default=96, help="the run's completion limit")
    parser.add_argument("--temperatures", type=float, nargs="+", default=[0.5, 0.8, 1.0, 1.2])
    parser.add_argument("--model", default=DEFAULT_MODEL, help="the run's model: the shipped one, or a local directory")
    parser.add_argument("--backend", choices=["torch", "vllm"], default="torch", help="the honest nodes' engine")
    parser.add_argument("--dtypes", nargs="+", choices=["float32", "bfloat16"], default=["float32", "bfloat16"])
    parser.add_argument(
        "--calibrate-rows",
        type=int,
        default=256,
        help="honest rows per numerics a model other than the shipped one is calibrated on",
    )
    parser.add_argument(
        "--widened",
        type=float,
        help="judge by every bound of the floor widened this many times (4: the most an operate-scope token may set)",
    )
    args = parser.parse_args()
    MODEL_NAME, BACKEND = args.model, args.backend
    MODEL, TOKENIZER = load_model(MODEL_NAME)

    print(
        f"model {MODEL_NAME} ({sum(p.numel() for p in MODEL.parameters()) / 1e6:.1f} M parameters, "
        f"{MODEL.config.vocab_size} vocabulary), {BACKEND} nodes"
    )
    if MODEL_NAME != DEFAULT_MODEL:
        TOLERANCES = calibrate(args.dtypes, args.calibrate_rows, args.max_tokens)
    if args.widened:
        TOLERANCES = widened(args.dtypes, args.widened)
        print(f"every bound {args.widened:g}x the floor: {widening(TOLERANCES):g}x as the run's page shows it")
    print(
        f"honest nodes: {args.rows} rows per configuration, 16-row tasks, validator batches {BATCHES}, limit {args.max_tokens} tokens"
    )
    previous = {"bfloat16": [0, 0], "float32": [0, 0]}
    current = {"bfloat16": 0, "float32": 0}
    for dtype in args.dtypes:
        if BACKEND == "vllm":
            close_engine()  # an engine computes in the dtype it started with
        for n, temperature in enumerate(args.temperatures):
            r = honest(dtype, temperature, args.rows, args.max_tokens, first_seed=10_000 * (n + 1))
            print(
                f"  {dtype:8s} T={temperature:<4} rows {r['rows']:5.0f}  rejected rows {r['rejected_rows']:3.0f} "
                f"(tasks {r['rejected_tasks']:.0f}/{r['tasks']:.0f})  untrained rows {r['untrained']:3.0f}  "
                f"previous check rejected rows {r['previous_rejected_rows']:4.0f}  "
                f"validator/node tokens/s {r['validator_tokens_per_s'] / r['node_tokens_per_s']:.2f}  {r['s']:.0f} s",
                flush=True,
            )
            current[dtype] += int(r["rejected_rows"])
            previous[dtype][0] += int(r["previous_rejected_rows"])
            previous[dtype][1] += int(r["rows"])

    print(f"forgeries: {args.forged_tasks} tasks each at T=1.0, declared as each dtype")
    for dtype in args.dtypes:
        if BACKEND == "vllm":
            close_engine()
        forged(dtype, args.forged_tasks, args.max_tokens)

    if BACKEND == "vllm":
        close_engine()
    rows = previous["bfloat16"][1]
    print(
        f"honest bf16 rows rejected: previous check {previous['bfloat16'][0]} of {rows}, this check {current['bfloat16']} of {rows} "
        f"(ratio previous/now: {previous['bfloat16'][0] / max(current['bfloat16'], 1):.0f}x, now {'0' if not current['bfloat16'] else current['bfloat16']})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
