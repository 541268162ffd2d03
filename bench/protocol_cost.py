"""What the protocol costs a real model: a fixed cost per file and a cost proportional to generation, measured
here, then projected to 0.5 B, 7 B and 32 B models.

Measured, on this machine:

- **fixed cost per file**: a devnet (coordinator, origin, relay, two validators, trainer, one node; one torch
  thread each) runs ``--seconds`` on ``tiny-arith`` (40-token answers) and on ``tiny-reason`` (about 270). Each
  role's CPU ledger (``bench/_cpu.py``) is split into what grows with the model (:data:`MODEL_WORK`: generation,
  proofs, prefill, the sampling check, the update), what comes once per policy step whatever the files
  (:data:`STEP_ROLES`, :data:`STEP_WORK`: weights, loading, publishing) and the rest: the coordinator, signatures, writing, sending
  and parsing the file, rewards. The rest is the fixed cost: part of it comes a file, part a second whatever the
  files (heartbeats, polls), and the two workloads, with their different file rates, give both.
- **proportional cost**: the validator's every check (:func:`validator.checks.validate`: parse, assignment,
  termination, prefill, TOPLOC, sampling check, rewards) of a node's files against the node's generating them
  (:func:`node.work.generate` and :func:`finish`), same files, one thread, on ``tiny-arith``, ``tiny-reason`` and
  a random Qwen3-0.6B-shaped model (``bench/_gpu_model.py``).

Projected, for a GPU node, from those terms and the H200 run of ``bench/gpu.py`` (``--gpu-run``); each column says
whether it is measured or assumed. Assumed: a file of ``--rows`` x ``--tokens`` (long reasoning); decoding
bound by reading the bf16 weights once a step at ``--bandwidth`` (an ideal engine), or by the per-step host time
our transformers node measured on the H200, whichever is longer; the validator's share of generation measured
on the H200 at 0.6 B staying as it is at 7 B and 32 B (prefill grows with the parameters as decoding does).

    python bench/protocol_cost.py [--seconds 60] [--rows 16] [--tokens 2000]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import _cpu
import torch
from _gpu_model import FULL, build_model
from _honest_files import made_and_checked
from _tasks import environment_task
from sqlalchemy import Engine, func, select

from intellect_protocol.coordinator.db import make_engine
from intellect_protocol.coordinator.models import Submission
from intellect_protocol.devnet.network import start_network
from intellect_protocol.shared import cpu_ledger
from intellect_protocol.shared.models import resolve_model
from intellect_protocol.shared.states import SubmissionStatus

MODEL_WORK = {
    ("node", "generation"),
    ("node", "proof building"),
    ("validators", "prefill"),
    ("validators", "proof checking"),
    ("validators", "sampling check"),
    ("trainer", "forward/backward"),
    ("trainer", "optimizer"),
}
"""What grows with the model's size, a token at a time."""
STEP_ROLES = {"relay and origin", "trainer"}
"""Roles whose every other second comes once a policy step, with the weights' size (publishing, serving them)."""
STEP_WORK = {(role, a) for role in ("node", "validators") for a in ("model loading", "weights download")}
"""What else comes once a policy step."""
WORKLOADS = {"tiny-arith": ("arithmetic", 64), "tiny-reason": ("long-sum", 400)}
"""Shipped model -> (environment, completion limit)."""
PROJECTED = {"0.5 B": 0.5e9, "7 B": 7e9, "32 B": 32e9}
"""Parameters of the projected models."""
FIRST_FILE_S = 300
"""Longest a devnet may take to start and have its first file accepted."""


def fixed_cost(model: str, seconds: float) -> tuple[float, int, dict[str, float]]:
    """A devnet's fixed CPU seconds in ``seconds`` from its first accepted file, the files accepted in them, and the
    fixed CPU seconds by role and activity."""
    environment, max_tokens = WORKLOADS[model]
    options = ["--environment", environment, "--model", resolve_model(model), "--max-tokens", str(max_tokens)]
    options += ["--prompts-per-task", "4", "--samples-per-prompt", "8"]
    with tempfile.TemporaryDirectory() as tmp:
        workdir, ledgers = Path(tmp), Path(tmp) / "cpu"
        os.environ[cpu_ledger.LEDGER_ENV] = str(ledgers)
        try:
            net = start_network(workdir, nodes=1, run_options=options, coordinator_env={"INTELLECT_HEARTBEAT_INTERVAL_S": "2"})
        finally:
            del os.environ[cpu_ledger.LEDGER_ENV]
        ledger = make_engine(net.database_url)
        try:
            deadline = time.monotonic() + FIRST_FILE_S
            while _accepted(ledger) == 0:  # from the first file on: every role started, every model loaded
                if time.monotonic() > deadline:
                    raise RuntimeError(f"no file was accepted in {FIRST_FILE_S} s:\n" + "".join(p.tail() for p in net.processes))
                time.sleep(0.5)
            files, spent = _accepted(ledger), _cpu.take(net, ledgers)
            time.sleep(seconds)
            used = _cpu.difference(_cpu.take(net, ledgers), spent)
            files = _accepted(ledger) - files
        finally:
            net.stop()
            ledger.dispose()
    if _cpu.tax(used) is None:  # its generation or update would be counted as the fixed cost
        raise RuntimeError(f"the {model} devnet's node or trainer wrote no CPU ledger: no fixed cost")
    fixed = {
        f"{role} {a}": s
        for role, activities in used.items()
        if role not in STEP_ROLES
        for a, s in activities.items()
        if a != _cpu.TOTAL and (role, a) not in MODEL_WORK | STEP_WORK
    }
    return sum(fixed.values()), files, fixed


def _accepted(ledger: Engine) -> int:
    with ledger.connect() as db:
        return int(db.scalar(select(func.count()).where(Submission.status == SubmissionStatus.accepted)) or 0)


def validator_share(name: str, model: str, environment: str, tokens: int, files: int, rows: tuple[int, int]) -> float:
    """The validator's whole check of ``files`` node files over the node's making them (one thread, same files)."""
    tasks = [environment_task(environment, i, model, 1.0, tokens, rows[0], rows[1], stop_on_eos=False) for i in range(files + 1)]
    costs = made_and_checked(tasks, model, environment)
    share = costs.check_s / costs.node_s
    print(f"  {name:<26} node's work {costs.node_s:6.1f} s, validator's check {costs.check_s:6.1f} s: {100 * share:5.1f} %")
    return share


def projection(args: argparse.Namespace, per_file_s: float, per_second_s: float) -> None:
    """The table: each model's generation per file, and the protocol's two costs as shares of it."""
    gpu = json.loads(args.gpu_run.read_text())
    at64 = gpu["throughput"]["by_node_batch"]["64"]
    floor_s = 64 / at64["generation_tokens_per_s"]  # our transformers node's step time at batch 64 (measured)
    checked = max((v for k, v in gpu["honest"]["by_validator"].items() if k.endswith("/sdpa")), key=lambda v: v["tokens_per_s"])
    validator = at64["generation_tokens_per_s"] / checked["tokens_per_s"]  # measured on the H200, 0.6 B
    prefill = 1 / at64["prefill_over_generation"]
    tokens = args.rows * args.tokens
    print(f"\nprojection: files of {args.rows} x {args.tokens} tokens (assumed), one node batch of 64 on an H200")
    print(
        f"  fixed cost (measured here, CPU): {1000 * per_file_s:.1f} ms a file + {1000 * per_second_s:.1f} ms a second of one node's work"
    )
    print(f"  validator / generation (measured on the H200 at 0.6 B; assumed the same above): prefill {100 * prefill:.1f} %,")
    print(f"    whole check at its best validator batch ({checked['tokens_per_s']:.0f} tokens/s) {100 * validator:.1f} %")
    print("  model  engine    step   generation   fixed /      validator /   protocol /")
    print("                          a file (s)   generation   generation    generation")
    print("                (assumed)  (assumed)   (measured)   (0.6 B: H200) (sum)")
    for name, parameters in PROJECTED.items():
        bound = 2 * parameters / args.bandwidth  # bf16 weights read once a decoding step
        for engine, step_s in (("ideal", bound), ("ours", max(floor_s, bound))):
            generation_s = tokens / 64 * step_s
            fixed = (per_file_s + per_second_s * generation_s) / generation_s  # one node generating back to back
            print(
                f"  {name:<6} {engine:<6} {1000 * step_s:6.1f} ms {generation_s:9.1f} {100 * fixed:11.2f} % "
                f"{100 * validator:10.1f} % {100 * (fixed + validator):10.1f} %"
            )
    print("  (ideal: decoding bound by the weights' bytes over the bandwidth; ours: or by the transformers node's host time a")
    print(f"  step measured on the H200, {1000 * floor_s:.1f} ms at batch 64, whichever is longer)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=60, help="each devnet's measured window, from its first accepted file")
    parser.add_argument("--rows", type=int, default=16, help="rows in a projected file")
    parser.add_argument("--tokens", type=int, default=2000, help="tokens in a projected row (a long reasoning answer)")
    parser.add_argument("--bandwidth", type=float, default=4.8e12, help="GPU memory bytes/s of the projection (H200: 4.8 TB/s)")
    parser.add_argument("--gpu-run", type=Path, default=Path(__file__).parent.parent / "docs/gpu/h200-run3.json")
    args = parser.parse_args()
    torch.set_num_threads(1)

    print("fixed cost per file: devnets on two workloads, CPU seconds by role outside generation, proofs, checks, update")
    measured = {}
    for model in WORKLOADS:
        spent, files, by_role = fixed_cost(model, args.seconds)
        measured[model] = (spent, files)
        roles = ", ".join(f"{r} {s:.1f}" for r, s in sorted(by_role.items(), key=lambda x: -x[1]) if s >= 0.05)
        print(f"  {model}: {spent:.1f} CPU s over {files} files in {args.seconds:.0f} s ({roles})", flush=True)
    # spent = per_file * files + per_second * seconds, for both workloads (the same seconds, other file rates)
    (small, small_files), (large, large_files) = measured.values()
    per_file = (small - large) / max(small_files - large_files, 1)
    per_second = (small - per_file * small_files) / args.seconds

    print("proportional cost: the validator's check against generation, same files, one thread")
    with tempfile.TemporaryDirectory() as tmp:
        parameters, _ = build_model(FULL, Path(tmp), torch.device("cpu"))
        validator_share("tiny-arith", resolve_model("tiny-arith"), "arithmetic", 48, 4, (4, 4))
        validator_share("tiny-reason", resolve_model("tiny-reason"), "long-sum", 300, 2, (4, 4))
        validator_share(f"random Qwen3 {parameters / 1e9:.2f} B", tmp, "arithmetic", 16, 1, (2, 2))
    projection(args, per_file, per_second)


if __name__ == "__main__":
    main()
