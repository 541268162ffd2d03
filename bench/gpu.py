"""GPU checks in one command: does honest GPU work pass the validator, and what do checking and training cost.

On a random Qwen3-0.6B-shaped model (28 layers, hidden 1,024, Qwen's 151,936-token vocabulary over a BPE
tokenizer trained here, weights scaled so a token's distribution is peaked as a trained model's is) computing
in bf16, with the project's own code for every role:

- honest rows: the node's torch backend generates at batch sizes 1, 8, 64 and 256 (16-row files, the devnet's
  task size); the real validator checks each file at another prefill batch size and attention kernel (sdpa, eager),
  by the tolerances a run calibrates on this model first. Goal: 0 of at least 5,000 rows rejected.
- forgeries: every kind of bench/verification.py. Goal: no forged row reaches training.
- TOPLOC: building and verifying proofs, microseconds per committed position (CPU work of node and validator).
- throughput: the validator's prefill tokens/s over the node's generation tokens/s on the same rows, at node
  batches 64 and 256 (goal at least 25x), and the validator's whole check's (prefill, proofs, sampling check, rewards).
- one GRPO step (fp32 weights, AdamW) on 64 rows.
- the seeded sampler's noise: the same bits on the GPU as on the CPU, or how far from them.

Each part stops at its share of ``--minutes``, and the table says how far it got. The table is printed and
written as JSON (``--out``) after every part, so a run cut short keeps what it measured; a part that fails
records its error and the others still run.

Needs torch, transformers and the package's pure-Python dependencies (pydantic, pydantic-settings, pyarrow,
eth-utils, py-ecc); not vLLM, not the network, not an installed package (it imports the checkout's code).

    python bench/gpu.py [--device cuda] [--minutes 8] [--out gpu.json]
    python bench/gpu.py --device cpu --small     # the same code on a 2-layer model in under a minute (a test runs it)
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import math
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

BENCH = Path(__file__).resolve().parent
try:
    import intellect_protocol.shared  # noqa: F401
except ModuleNotFoundError:  # a plain checkout, as on a GPU machine without the package's build tools
    sys.path.insert(0, str(BENCH))
    from _worktree import checkout

    sys.path.insert(0, str(checkout(BENCH.parent, Path(tempfile.mkdtemp()))))

from _gpu_model import FILE_ROWS, FORGED_ROWS, FULL, SMALL, Plan, build_model, with_kernel  # noqa: E402
from _gpu_report import Report, table  # noqa: E402
from _tasks import arithmetic_task  # noqa: E402
from pydantic import TypeAdapter  # noqa: E402

from intellect_protocol.devnet.numerics_forgeries import cherry_pick, resampled, shifted_logprobs  # noqa: E402
from intellect_protocol.node.work import Generated, problems_for, score  # noqa: E402
from intellect_protocol.shared.environments.registry import get_environment, plugin  # noqa: E402
from intellect_protocol.shared.inference import Completion, prefill_batch  # noqa: E402
from intellect_protocol.shared.models import encode_prompt, load_model  # noqa: E402
from intellect_protocol.shared.rollout_file import Rollout, read_rollouts, write_rollouts  # noqa: E402
from intellect_protocol.shared.sampling import gumbel_noise  # noqa: E402
from intellect_protocol.shared.schemas import SamplingParams, TaskSpec  # noqa: E402
from intellect_protocol.shared.tasks import assigned_rows, budget_of  # noqa: E402
from intellect_protocol.shared.tolerances import Calibration  # noqa: E402
from intellect_protocol.shared.toploc import build_proofs_batch, verify_proofs_batch  # noqa: E402
from intellect_protocol.shared.torch_backend import TorchBackend  # noqa: E402
from intellect_protocol.trainer.data import Batch, Group  # noqa: E402
from intellect_protocol.trainer.distributed import Placement  # noqa: E402
from intellect_protocol.trainer.learner import Learner  # noqa: E402
from intellect_protocol.trainer.settings import TrainerSettings  # noqa: E402
from intellect_protocol.validator.calibration import calibration_file, measure  # noqa: E402
from intellect_protocol.validator.checks import CheckSettings, Context, Verdict, in_dtype, validate  # noqa: E402

TEMPERATURES = (0.7, 1.0)
VALIDATORS = [(batch, kernel) for batch in (16, 4, 1, 8, 2) for kernel in ("sdpa", "eager")]
"""(prefill batch, attention kernel) a validator checks with, in turn; never the node's own batch size."""
MEASURED_BATCH = 64
"""Prefill is compared with generation on one call's rows at this node batch and larger; GRPO trains on them."""


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def noise_part(report: Report, device: torch.device, vocab: int) -> None:
    with report.part("noise") as f:
        seeds = torch.tensor([0, 1, 2**40 + 7, -5], dtype=torch.int64)
        positions = torch.tensor([0, 17, 4095, 3], dtype=torch.int64)
        here, cpu = gumbel_noise(seeds.to(device), positions.to(device), vocab).cpu(), gumbel_noise(seeds, positions, vocab)
        f |= {"identical_to_cpu": bool(torch.equal(here, cpu)), "values": here.numel()}
        f |= {"differing": int((here != cpu).sum()), "largest_difference": float((here - cpu).abs().max())}


class Roles:
    """The node's model (loaded in bf16, as a node loads it) and the validator's (fp32, as a validator holds
    it, computing bf16 files in a bf16 copy of its parameters), one per attention kernel."""

    def __init__(self, directory: Path, device: torch.device) -> None:
        self.directory = directory
        self.device = device
        node_model, self.tokenizer = load_model(directory, dtype=torch.bfloat16, device=str(device))
        self.node = TorchBackend(node_model, self.tokenizer.eos_token_id, self.tokenizer.pad_token_id, threads=None)
        self.validators = {k: with_kernel(load_model(directory, device=str(device))[0], k) for k in ("sdpa", "eager")}
        self.pin = plugin("arithmetic").pin
        self.environment = get_environment("arithmetic", self.pin)
        self.problems = problems_for("arithmetic", self.pin)
        self.tolerances: Calibration | None = None

    def task(self, seed: int, prompts: int, samples: int, temperature: float, max_tokens: int) -> TaskSpec:
        return arithmetic_task(seed, str(self.directory), temperature, max_tokens, prompts, samples, self.tolerances)

    def generate(self, tasks: list[TaskSpec], batch: int) -> list[Generated]:
        """The tasks' completions from the node's backend, ``batch`` rows a call across the tasks' rows."""
        rows = [assigned_rows(t, self.problems, self.tokenizer) for t in tasks]
        flat = [r for task_rows in rows for r in task_rows]
        completions: list[Completion] = []
        begun = time.perf_counter()
        for start in range(0, len(flat), batch):
            chosen = flat[start : start + batch]
            completions += self.node.generate([r.prompt_tokens for r in chosen], [r.seed for r in chosen], tasks[0].sampling)
        share = (time.perf_counter() - begun) / len(tasks)
        out, start = [], 0
        for task, task_rows in zip(tasks, rows):
            mine = completions[start : start + len(task_rows)]
            start += len(task_rows)
            out.append(Generated(task, task_rows, mine, budget_of(task), share, self.node.numerics))
        return out

    def check(self, data: bytes, task: TaskSpec, batch: int, kernel: str) -> Verdict:
        sha256 = hashlib.sha256(data).hexdigest()
        ctx = Context(task, sha256, 0, 0, self.validators[kernel], self.tokenizer, self.environment, self.problems)
        return validate(data, ctx, CheckSettings(prefill_batch=batch))


def calibrate_part(report: Report, roles: Roles, plan: Plan) -> None:
    with report.part("calibration") as f:
        problems = list(roles.problems.values())[: plan.calibration_rows]
        prompts = [encode_prompt(roles.tokenizer, p.prompt) for p in problems]
        params = SamplingParams(temperature=1.0, max_tokens=plan.max_tokens)
        m = measure(roles.validators["sdpa"], roles.tokenizer, prompts, "bfloat16", params, backend=roles.node, batch=64)
        f |= {"rows": m.rows, "deviations": m.deviations, "max_gap": m.max_gap, "floor_would_reject": m.rejected_rows}
        roles.tolerances = TypeAdapter(Calibration).validate_python(
            calibration_file(str(roles.directory), 2.0, [m])["tolerances"]
        )
        f["tolerance"] = roles.tolerances["torch/bfloat16"].model_dump()


@dataclasses.dataclass
class Honest:
    """What the honest part keeps for the parts after it."""

    files: dict[int, list[tuple[Generated, bytes, list[bytes]]]] = dataclasses.field(default_factory=dict)
    """By node batch of at least :data:`MEASURED_BATCH`, one call's files: the generation, the file, its proofs."""
    generation_tokens_per_s: dict[int, float] = dataclasses.field(default_factory=dict)


def honest_part(report: Report, roles: Roles, plan: Plan, until: float) -> Honest:
    kept = Honest()
    with report.part("honest") as f:
        totals: dict[str, float] = defaultdict(float)
        by_node: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        by_validator: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        reasons: list[str] = []
        f |= {"by_node_batch": by_node, "by_validator": by_validator, "reasons": reasons, "totals": totals}
        seed, turn = 1, 0
        for node_batch, wanted in plan.honest_rows.items():
            rows = 0
            per_call = max(1, node_batch // FILE_ROWS)
            while rows < wanted and report.left(until) > 0:
                temperature = TEMPERATURES[seed % len(TEMPERATURES)]
                tasks = [roles.task(seed + i, 4, 4, temperature, plan.max_tokens) for i in range(per_call)]
                seed += per_call
                for generated in roles.generate(tasks, node_batch):
                    begun = time.perf_counter()
                    proofs = build_proofs_batch([c.hidden for c in generated.completions])
                    totals["proof_build_s"] += time.perf_counter() - begun
                    data = write_rollouts(score(generated, proofs), generated.numerics)
                    tokens = sum(len(c.tokens) for c in generated.completions)
                    totals["positions"] += sum(len(c.hidden) for c in generated.completions)
                    batch, kernel = next(v for v in _turns(turn) if v[0] != node_batch)
                    turn += 1
                    synchronize(roles.device)
                    begun = time.perf_counter()
                    verdict = roles.check(data, generated.task, batch, kernel)
                    synchronize(roles.device)
                    checked_s = time.perf_counter() - begun
                    rejected = 0 if verdict.accepted else len(generated.rows)
                    if rejected and len(reasons) < 5:
                        reasons.append(f"node batch {node_batch}, validator {batch}/{kernel}: {verdict.reason[:300]}")
                    for figures in (by_node[node_batch], by_validator[f"{batch}/{kernel}"]):
                        figures["rows"] += len(generated.rows)
                        figures["rejected_rows"] += rejected
                        figures["tokens"] += tokens
                    by_node[node_batch]["generate_s"] += generated.generate_s
                    by_validator[f"{batch}/{kernel}"]["check_s"] += checked_s
                    totals["rows"] += len(generated.rows)
                    totals["rejected_rows"] += rejected
                    totals["untrained_rows"] += len(verdict.untrained_rows)
                    rows += len(generated.rows)
                    kept_files = kept.files.setdefault(node_batch, []) if node_batch >= MEASURED_BATCH else []
                    if len(kept_files) < per_call:
                        kept_files.append((generated, data, proofs))
            print(f"    node batch {node_batch}: {rows} rows, {by_node[node_batch]['rejected_rows']:.0f} rejected", flush=True)
        for node_batch, figures in by_node.items():
            figures["tokens_per_s"] = figures["tokens"] / max(figures["generate_s"], 1e-9)
            kept.generation_tokens_per_s[node_batch] = figures["tokens_per_s"]
        for figures in by_validator.values():
            figures["tokens_per_s"] = figures["tokens"] / max(figures["check_s"], 1e-9)
        totals["proof_build_us_per_position"] = 1e6 * totals["proof_build_s"] / max(totals["positions"], 1)
        totals["check_tokens_per_s"] = sum(v["tokens"] for v in by_validator.values()) / max(
            sum(v["check_s"] for v in by_validator.values()), 1e-9
        )
    return kept


def _turns(turn: int) -> list[tuple[int, str]]:
    """The validator configurations from ``turn`` on, round the list once."""
    return VALIDATORS[turn % len(VALIDATORS) :] + VALIDATORS[: turn % len(VALIDATORS)]


def throughput_part(report: Report, roles: Roles, honest: Honest) -> None:
    """The validator's prefill against generation on the same rows, by node batch, and TOPLOC's verification."""
    with report.part("throughput") as f:
        if not honest.files:
            raise RuntimeError(f"no honest files of node batch {MEASURED_BATCH} or more to measure on")
        model = in_dtype(roles.validators["sdpa"], "bfloat16")
        by_batch = f["by_node_batch"] = {}
        for node_batch, files in sorted(honest.files.items()):
            rollouts = [r for _, data, _ in files for r in read_rollouts(data)]
            prompts, completions = [r.prompt_tokens for r in rollouts], [r.completion_tokens for r in rollouts]
            times = []
            for _ in range(4):  # the first warms the kernels up
                synchronize(roles.device)
                begun = time.perf_counter()
                prefill_batch(model, prompts, completions)
                synchronize(roles.device)
                times.append(time.perf_counter() - begun)
            prefill = sum(map(len, completions)) / statistics.median(times[1:])
            generation = honest.generation_tokens_per_s[node_batch]
            by_batch[node_batch] = {"rows": len(rollouts), "prefill_tokens_per_s": prefill, "generation_tokens_per_s": generation}
            by_batch[node_batch]["prefill_over_generation"] = prefill / generation
        kept = [file for files in honest.files.values() for file in files]
        hiddens = [c.hidden for g, _, _ in kept for c in g.completions]
        proofs = [p for _, _, file_proofs in kept for p in file_proofs]
        begun = time.perf_counter()
        results = verify_proofs_batch(hiddens, proofs)
        f["proof_verify_us_per_position"] = 1e6 * (time.perf_counter() - begun) / sum(len(h) for h in hiddens)
        f |= {"proofs": len(proofs), "proofs_verified": sum(all(c.ok for c in row) for row in results)}


def grpo_part(report: Report, roles: Roles, honest: Honest) -> None:
    with report.part("grpo") as f:
        rollouts = [r for _, data, _ in honest.files[MEASURED_BATCH][: MEASURED_BATCH // FILE_ROWS] for r in read_rollouts(data)]
        groups: dict[tuple[str, str], list[Rollout]] = defaultdict(list)
        for r in rollouts:
            groups[(r.task_id, r.prompt_id)].append(r)
        batch = Batch(groups=[Group(key, rows) for key, rows in groups.items()])
        model = load_model(roles.directory, device=str(roles.device))[0]
        model.train()
        settings = TrainerSettings(optimizer_steps=1, micro_batch=16, warmup_steps=0)
        learner = Learner(model, settings, TEMPERATURES[0], Placement(0, 1, roles.device))
        times = []
        for step in range(3):  # the first allocates the optimizer's state
            synchronize(roles.device)
            begun = time.perf_counter()
            metrics = learner.step(batch, step)
            synchronize(roles.device)
            times.append(time.perf_counter() - begun)
        f |= {"rows": len(rollouts), "tokens": sum(len(r.completion_tokens) for r in rollouts)}
        f |= {"step_s": statistics.median(times[1:]), "first_step_s": times[0], "loss_finite": math.isfinite(metrics["loss"])}
        f["tokens_per_s"] = f["tokens"] / f["step_s"]
        if roles.device.type == "cuda":
            f["peak_gib"] = torch.cuda.max_memory_allocated(roles.device) / 2**30
        del learner, model


def forgeries_part(report: Report, roles: Roles, plan: Plan, until: float) -> None:
    model, eos = roles.node.model, roles.tokenizer.eos_token_id

    def steered(_row: Any, tokens: list[int], _generated: Generated) -> float:
        # A random model's rewards are all 0: this forger steers towards lower token ids instead.
        return -float(sum(tokens))

    forgers: dict[str, Callable[[Generated], bytes]] = {  # the cheap ones first, should time run out
        "logprobs +0.019 on every token": lambda g: shifted_logprobs(g, 0.019, every_token=True),
        "logprob +0.8 on one token a row": lambda g: shifted_logprobs(g, 0.8, every_token=False),
        "logprob -89 on one token a row": lambda g: shifted_logprobs(g, -89.0, every_token=False),
        "another seed": lambda g: resampled(g, model, eos, seed_offset=7),
        "another temperature (1.3 for 1.0)": lambda g: resampled(g, model, eos, temperature=1.3),
        "cherry-pick (first near-tie steered)": lambda g: cherry_pick(g, model, eos, tries=2, objective=steered)[0],
        "cherry-pick (every near-tie steered)": lambda g: cherry_pick(g, model, eos, every=True, tries=2, objective=steered)[0],
    }
    with report.part("forgeries") as f:
        figures = {name: {"files": 0, "accepted": 0, "forged_rows_trained": 0} for name in forgers}
        f |= figures
        # Every kind's first file before any kind's second, should time run out; the honest files in one call.
        turns = [(i, n, name) for i in range(plan.forged_files) for n, name in enumerate(forgers)]
        tasks = [roles.task(90_000 + 100 * n + i, 1, FORGED_ROWS, 1.0, plan.max_tokens) for i, n, _ in turns]
        for (i, _, name), generated in zip(turns, roles.generate(tasks, len(tasks) * FORGED_ROWS)):
            if report.left(until) <= 0:
                figures[name]["cut_short"] = True
                continue
            honest_data = write_rollouts(
                score(generated, build_proofs_batch([c.hidden for c in generated.completions])), generated.numerics
            )
            data = forgers[name](generated)
            changed = _changed_rows(data, honest_data, logprobs=name.startswith("logprob"))
            if not changed:
                continue  # nothing to forge in this file (no near-tie moved the objective)
            batch, kernel = VALIDATORS[i % len(VALIDATORS)]
            verdict = roles.check(data, generated.task, batch, kernel)
            figures[name]["files"] += 1
            figures[name]["accepted"] += verdict.accepted
            figures[name]["forged_rows_trained"] += len(changed - set(verdict.untrained_rows)) if verdict.accepted else 0
        for name, kind in figures.items():
            print(f"    {name}: {kind}", flush=True)


def _changed_rows(data: bytes, honest: bytes, logprobs: bool) -> set[int]:
    """Rows whose tokens (or, for logprob forgeries, logprobs) differ from the honest file's."""
    pairs = list(zip(read_rollouts(data), read_rollouts(honest)))
    if logprobs:
        return {i for i, (a, b) in enumerate(pairs) if max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) > 1e-6}
    return {i for i, (a, b) in enumerate(pairs) if a.completion_tokens != b.completion_tokens}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="where every role computes")
    parser.add_argument("--small", action="store_true", help="a 2-layer model and a few files: the CPU test of this script")
    parser.add_argument("--minutes", type=float, default=8.0, help="the whole run's budget; each part stops at its share")
    parser.add_argument("--out", type=Path, default=Path("gpu.json"), help="where the table's figures are written as JSON")
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda, but torch sees no CUDA device (on a CPU machine: --device cpu --small)")
    if device.type == "cpu":
        torch.set_num_threads(1)
    plan = SMALL if args.small else FULL
    report = Report(args.out, 60 * args.minutes)
    card = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    import transformers

    report.parts["machine"] = {"device": card, "torch": torch.__version__, "transformers": transformers.__version__}
    with tempfile.TemporaryDirectory() as directory:
        with report.part("model", fatal=True) as f:
            parameters, vocab = build_model(plan, Path(directory), device)
            f |= {"parameters": parameters, "vocab": vocab, "layers": plan.layers, "hidden": plan.hidden}
            roles = Roles(Path(directory), device)
        noise_part(report, device, vocab)
        calibrate_part(report, roles, plan)
        honest = honest_part(report, roles, plan, until=0.75)
        throughput_part(report, roles, honest)
        grpo_part(report, roles, honest)
        forgeries_part(report, roles, plan, until=0.95)
    title = f"bench/gpu.py on {card}: a random Qwen3-shaped model of {parameters / 1e9:.2f} B parameters, bf16"
    print(table(report, title))
    report.parts["table"] = {"text": table(report, title)}
    report.save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
