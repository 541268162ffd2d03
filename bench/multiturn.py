"""Multi-turn episodes under verification: honest ones pass, forged ones are caught, and what checking them costs.

On the shipped tool-using model (``tiny-calc``) and the calculator environment, with the node's and the validator's
own code (the environment in its bounded process on both sides, as the roles run it):

- honest rows rejected: at least ``--rows`` rows of episodes in fp32 and in bf16, on torch nodes and on vLLM nodes
  (its CPU build here; skipped with a line where it is not installed), each file checked by a validator holding the
  model in fp32. Goal: 0.
- forged episodes caught: every kind of lie about who wrote which token, a reply of another plugin's format, and an
  episode drawn under another seed. Goal: all.
- the validator's CPU time per file over the node's (generation, proofs and the file, the environment's replies in
  its bounded process included), against the same ratio for single-turn work on the same-sized ``tiny-arith``: one
  single-turn file after each fp32 multi-turn file, in this run, each ratio the median of its files' (CPU time, not
  wall time: this machine is shared; a baseline whose two halves' medians differ by more than half is refused).
  Goal: at most the single-turn ratio + 10 %.
- the environment's reply per turn, on the node (a round trip to its bounded process).

    python bench/multiturn.py [--rows 2000] [--nodes torch,vllm]
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import cast

import psutil
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _tasks import environment_task  # noqa: E402

from intellect_protocol.node.settings import BackendKind, Dtype  # noqa: E402
from intellect_protocol.node.work import backend_for, finish, generate_with  # noqa: E402
from intellect_protocol.shared.engines import vllm_unusable  # noqa: E402
from intellect_protocol.shared.environments.bounded import BoundedRewards  # noqa: E402
from intellect_protocol.shared.environments.registry import get_environment, plugin  # noqa: E402
from intellect_protocol.shared.environments.turns import rules_of  # noqa: E402
from intellect_protocol.shared.models import load_model  # noqa: E402
from intellect_protocol.shared.rollout_file import ADMITTED, Rollout, read_numerics, read_rollouts, write_rollouts  # noqa: E402
from intellect_protocol.shared.schemas import TaskSpec  # noqa: E402
from intellect_protocol.validator.checks import Context, Verdict, validate  # noqa: E402

PROMPTS, SAMPLES, MAX_TOKENS = 16, 8, 32
GOAL_MARGIN = 1.10


class Roles:
    """A node (``kind``'s backend, its model in ``dtype``) and a validator (fp32) on ``model`` and ``environment``."""

    def __init__(self, environment: str, model: str, dtype: Dtype, kind: BackendKind = "torch") -> None:
        self.environment, self.model, self.dtype = environment, model, dtype
        self.node, self.tokenizer = backend_for(model, kind, dtype)
        self.checker, _ = load_model(model)
        found = get_environment(environment)
        self.problems = {p.id: p for p in found.problems()}
        self.rules = rules_of(found, MAX_TOKENS)
        self.replies = BoundedRewards(environment, plugin(environment).pin)

    def honest(self, seed: int) -> tuple[TaskSpec, bytes, float]:
        task = environment_task(self.environment, seed, self.model, 1.0, MAX_TOKENS, PROMPTS, SAMPLES)
        begun = cpu_s()
        data = finish(generate_with(self.node, self.tokenizer, task)).data
        return task, data, cpu_s() - begun

    def check(self, task: TaskSpec, data: bytes) -> tuple[Verdict, float]:
        sha = hashlib.sha256(data).hexdigest()
        ctx = Context(task, sha, 0, 0, self.checker, self.tokenizer, self.replies, self.problems, self.rules)
        begun = cpu_s()
        verdict = validate(data, ctx)
        return verdict, cpu_s() - begun

    def file(self, seed: int) -> tuple[Verdict, float, float]:
        """One honest file made and checked: the verdict, and the node's and the validator's CPU seconds."""
        task, data, made = self.honest(seed)
        verdict, checked = self.check(task, data)
        if not verdict.accepted:
            print(f"    rejected ({self.dtype}, seed {seed}): {verdict.reason[:300]}", flush=True)
        return verdict, made, checked


def cpu_s() -> float:
    """CPU seconds of this process and its children (the environments' bounded processes) so far. This process's
    to the nanosecond: psutil counts clock ticks of 10 ms, a tenth of a file's validation, which alone moved the
    ratio by several per cent between runs; the children's share is small, and ticks do for it."""
    children = psutil.Process().children(recursive=True)
    return time.process_time() + sum(t.user + t.system for t in (p.cpu_times() for p in children))


def honest_part(roles: Roles, rows: int, first_seed: int, baseline: Roles | None = None) -> dict[str, object]:
    """Rows rejected, and each file's (node, validator) CPU seconds, over at least ``rows`` honest rows; with
    ``baseline``, one of its files after each (their seconds under ``baseline``)."""
    made = rejected = untrained = 0
    files: list[tuple[float, float]] = []
    single: list[tuple[float, float]] = []
    for warm in (roles, baseline):  # not measured: a first file starts both sides' reward processes
        if warm is not None:
            warm.file(first_seed - 1)
    seed = first_seed
    while made < rows:
        verdict, node_s, check_s = roles.file(seed)
        n = PROMPTS * SAMPLES
        made, files = made + n, [*files, (node_s, check_s)]
        rejected += 0 if verdict.accepted else n
        untrained += len(verdict.untrained_rows)
        if baseline is not None:
            single.append(baseline.file(10_000 + seed)[1:])
        seed += 1
    return {"rows": made, "rejected": rejected, "untrained": untrained, "files": files, "baseline": single}


def ms(files: list[tuple[float, float]]) -> str:
    """Median node and validator CPU milliseconds a file."""
    node, check = (statistics.median(1e3 * f[side] for f in files) for side in (0, 1))
    return f"node {node:.0f} ms, validator {check:.0f} ms a file"


def _replied(rows: list[Rollout]) -> Rollout:
    return next(r for r in rows if r.sampled is not None and not all(r.sampled))


def _first_reply(r: Rollout) -> int:
    return (r.sampled or []).index(False)


def forgers(roles: Roles) -> dict[str, Callable[[list[Rollout]], None]]:
    digit = roles.tokenizer.convert_tokens_to_ids("7")
    zero = roles.tokenizer.convert_tokens_to_ids("0")

    def forged_tool_output(rows: list[Rollout]) -> None:
        r = _replied(rows)
        r.completion_tokens[_first_reply(r)] = digit if r.completion_tokens[_first_reply(r)] != digit else zero

    def sampled_as_environments(rows: list[Rollout]) -> None:
        r = _replied(rows)
        at = _first_reply(r) - 1
        r.sampled[at], r.logprobs[at] = False, 0.0

    def environments_as_sampled(rows: list[Rollout]) -> None:
        r = _replied(rows)
        at = _first_reply(r)
        r.sampled[at], r.logprobs[at] = True, -0.5

    def other_plugin_format(rows: list[Rollout]) -> None:
        r = _replied(rows)  # a tool answering 09716 for 9716: another release's format
        at = _first_reply(r)
        r.completion_tokens.insert(at, zero)
        r.logprobs.insert(at, 0.0)
        r.sampled.insert(at, False)
        for column in (r.completion_tokens, r.logprobs, r.sampled):
            del column[-2]

    def too_many_turns(rows: list[Rollout]) -> None:
        r = _replied(rows)
        r.sampled = [i % 2 == 0 for i in range(len(r.completion_tokens))]
        r.logprobs = [lp if s else 0.0 for lp, s in zip(r.logprobs, r.sampled)]

    return {
        "forged tool output": forged_tool_output,
        "sampled tokens labelled the environment's": sampled_as_environments,
        "environment's tokens labelled sampled": environments_as_sampled,
        "another plugin release's reply": other_plugin_format,
        "more environment turns than allowed": too_many_turns,
    }


def forgeries_part(roles: Roles, files: int) -> dict[str, tuple[int, int]]:
    """Per kind of forgery: (files caught, files forged)."""
    found: dict[str, tuple[int, int]] = {}
    for n, (name, forge) in enumerate(forgers(roles).items()):
        caught = 0
        for i in range(files):
            task, data, _ = roles.honest(50_000 + 100 * n + i)
            rows = read_rollouts(data, ADMITTED)
            forge(rows)
            verdict, _ = roles.check(task, write_rollouts(rows, read_numerics(data)))
            caught += not verdict.accepted and verdict.hard
        found[name] = (caught, files)
    caught = 0
    for i in range(files):  # drawn under other seeds, labelled with the assigned ones
        task, data, _ = roles.honest(60_000 + i)
        other = task.model_copy(update={"seed": task.seed + 7})
        drawn = read_rollouts(finish(generate_with(roles.node, roles.tokenizer, other)).data, ADMITTED)
        for r, assigned in zip(drawn, read_rollouts(data, ADMITTED)):
            r.task_id, r.seed = assigned.task_id, assigned.seed
        verdict, _ = roles.check(task, write_rollouts(drawn, read_numerics(data)))
        caught += not verdict.accepted and verdict.hard
    found["an episode drawn under another seed"] = (caught, files)
    return found


def reply_ms(roles: Roles, calls: int = 200) -> float:
    problem = next(iter(roles.problems.values()))
    begun = time.perf_counter()
    for _ in range(calls):
        roles.replies.reply(problem, 0, [problem.prompt.replace(":", "").join("[]")])
    return 1e3 * (time.perf_counter() - begun) / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=2000, help="Honest rows per dtype (at least).")
    parser.add_argument("--forged-files", type=int, default=4, help="Files per kind of forgery.")
    parser.add_argument("--nodes", default="torch,vllm", help="The node backends whose honest rows are checked.")
    args = parser.parse_args()
    torch.set_num_threads(1)
    single = Roles("arithmetic", "tiny-arith", "float32")
    results = {
        ("torch", dtype): honest_part(
            Roles("calculator", "tiny-calc", dtype), args.rows, 1, single if dtype == "float32" else None
        )
        for dtype in cast(list[Dtype], ["float32", "bfloat16"])
        if "torch" in args.nodes.split(",")
    }
    unusable = vllm_unusable() if "vllm" in args.nodes.split(",") else []
    if "vllm" in args.nodes.split(",") and not unusable:
        from intellect_protocol.shared.vllm_backend import close_engine

        for dtype in cast(list[Dtype], ["float32", "bfloat16"]):
            results["vllm", dtype] = honest_part(Roles("calculator", "tiny-calc", dtype, "vllm"), args.rows, 20_001)
            close_engine()  # the engine's dtype is set when it starts
    roles = Roles("calculator", "tiny-calc", "float32")
    forged = forgeries_part(roles, args.forged_files)
    per_turn = reply_ms(roles)
    print(f"bench/multiturn.py: tiny-calc on calculator, {PROMPTS} prompts x {SAMPLES} samples a file")
    for (kind, dtype), figures in results.items():
        print(
            f"  {kind} node, {dtype}: {figures['rejected']} of {figures['rows']} honest rows rejected (goal 0), "
            f"{figures['untrained']} kept out of training"
        )
    if unusable:
        print(f"  vLLM nodes: not measured ({'; '.join(unusable)})")
    for name, (caught, files) in forged.items():
        print(f"  forged, {name}: {caught} of {files} files caught (goal all)")
    print(f"  environment reply, node side: {per_turn:.2f} ms a turn (a round trip to its bounded process)")
    fp32 = results["torch", "float32"]
    files, baseline = cast(list[tuple[float, float]], fp32["files"]), cast(list[tuple[float, float]], fp32["baseline"])
    multi, single = ([check / node for node, check in f] for f in (files, baseline))
    if len(single) < 2:
        raise SystemExit("the single-turn baseline needs two files at least (--rows 256): no ratio")
    half = len(single) // 2
    halves = [statistics.median(single[:half]), statistics.median(single[half:])]
    print(
        f"  CPU, median of {len(files)} files each: multi-turn {ms(files)}; single-turn (tiny-arith, interleaved) {ms(baseline)}"
    )
    print(
        f"  validator / node CPU per file: multi-turn {statistics.median(multi):.3f}, single-turn {statistics.median(single):.3f} "
        f"({halves[0]:.3f} in its first half, {halves[1]:.3f} in its second)"
    )
    if max(halves) > 1.5 * min(halves):
        raise SystemExit("the single-turn baseline moved by more than half between its two halves (a busy machine?): no ratio")
    print(
        f"validator / node CPU per episode, multi-turn against single-turn: "
        f"x{statistics.median(multi) / statistics.median(single):.2f} (goal: at most x{GOAL_MARGIN:.2f})"
    )


if __name__ == "__main__":
    main()
