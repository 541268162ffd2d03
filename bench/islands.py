"""Trainer islands against one trainer: what crosses between sites, how fast the model learns, and how
much of an island's time is spent computing rather than waiting for the outer step.

Both configurations learn by the recipe of ``bench/_single_process.py`` (tasks cut as the coordinator
cuts them, completions from the node's torch backend scored by the node's code, the trainer's
:class:`~trainer.learner.Learner`), on the shipped model, for ``--seconds`` each, on the same cores:

- **one trainer**: one process with one torch thread per island, generating and learning
  ``--groups`` groups a policy step;
- **islands**: ``--islands`` processes (one thread each) meeting through a real torchft lighthouse
  (:class:`~trainer.islands.OuterSync`): each generates from its own weights and learns ``--groups /
  islands`` groups an inner step, and they take an outer step every ``--sync-every`` inner steps.
  Each outer step is a policy step.

Afterwards an even sample of each configuration's policy steps is evaluated on the held-out
arithmetic problems (greedy accuracy). Printed, against the issue's goals:

(a) bytes sent between islands per rollout learned from, against the same islands all-reducing fp32
    gradients at every optimizer step (counted from the parameters and the optimizer steps taken, not
    sent): goal at least H x fewer, 2H x with bf16;
(b) the time each configuration needed to reach +10, +15 and +20 points of held-out accuracy and the
    highest accuracy both reach (and the accuracy curves): goal islands within 1.3x the one trainer's time;
(c) the share of island wall time spent computing (generation and inner steps) rather than in the outer
    step, measured here, and projected for a 7B model over a 1 Gbit/s link (goal >= 90 %).

With ``--liar KIND`` (``--islands 3 --min-islands 3`` or more) it runs the honest islands, then the same islands with the last
one lying at every outer step (``flip``: its pseudo-gradient sign-flipped at 1.2x its norm; ``noise``: noise
at 200x its norm; ``tiny``: 1e-9x), instead of the one trainer, and prints both held-out accuracy curves and
the last difference (goal: within 5 points).

    python bench/islands.py [--seconds 180] [--islands 2] [--sync-every 4] [--groups 16] [--liar flip|noise|tiny --min-islands 3]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import uuid
from pathlib import Path

import torch
from _islands import BIG_INNER_STEP_S, big_all_reduce_s, run_island_processes
from _single_process import Snapshot, learn, tasks

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from intellect_protocol.devnet.island_lies import lie  # noqa: E402
from intellect_protocol.node.work import generate_with, score  # noqa: E402
from intellect_protocol.shared.environments.arithmetic import held_out_problems  # noqa: E402
from intellect_protocol.shared.island_schemas import OuterSettings  # noqa: E402
from intellect_protocol.shared.models import load_model  # noqa: E402
from intellect_protocol.shared.schemas import DEFAULT_MODEL  # noqa: E402
from intellect_protocol.shared.tiny_model import greedy_accuracy  # noqa: E402
from intellect_protocol.shared.torch_backend import TorchBackend  # noqa: E402
from intellect_protocol.trainer.data import Batch, add_submission  # noqa: E402
from intellect_protocol.trainer.distributed import placement  # noqa: E402
from intellect_protocol.trainer.islands import OuterSync  # noqa: E402
from intellect_protocol.trainer.learner import Learner  # noqa: E402
from intellect_protocol.trainer.settings import TrainerSettings  # noqa: E402

RUN = ["--prompts-per-task", "4", "--samples-per-prompt", "8", "--max-tokens", "64"]
GAINS = (0.10, 0.15, 0.20)
"""Held-out accuracy gains over the shipped model whose times are also printed (as ``bench/learning.py``)."""


def island(args: argparse.Namespace) -> None:
    """One island's loop (a child process): writes ``OUT/island-I.pt`` (its timings, and the leader's snapshots)."""
    torch.set_num_threads(1)
    workdir = args.out / f"island-{args.index}"
    workdir.mkdir(parents=True, exist_ok=True)
    source = tasks(workdir, RUN)
    first = next(source)
    model, tokenizer = load_model(first.model)
    settings = TrainerSettings(groups_per_step=args.groups // args.islands)
    backend = TorchBackend(model, tokenizer.eos_token_id, tokenizer.pad_token_id, threads=1)
    learner = Learner(model, settings, first.sampling.temperature, placement())
    outer = OuterSettings(sync_every=args.sync_every, min_islands=args.min_islands)
    sync = OuterSync(model, f"island-{args.index}", args.lighthouse, outer, timeout_s=120)
    record: dict[str, list] = {"compute_s": [], "sync_s": [], "sent_bytes": [], "rollouts": [], "optimizer_steps": []}
    snapshots: list[Snapshot] = [(0.0, 0, {k: v.clone() for k, v in model.state_dict().items()})]
    # One clock for every island, so they stop after the same outer step.
    time.sleep(max(0.0, args.start_at - time.time()))
    started = time.perf_counter() - (time.time() - args.start_at)
    while time.perf_counter() - started < args.seconds:
        t0, rollouts, steps_before = time.perf_counter(), 0, learner.optimizer_steps
        for _ in range(outer.sync_every):
            batch = Batch()
            while len(batch.groups) < settings.groups_per_step:
                task = next(source).model_copy(update={"policy_step": sync.step})
                made = score(generate_with(backend, tokenizer, task), [b""] * len(task.prompt_ids) * task.samples_per_prompt)
                add_submission(batch, made, sync.step)
            rollouts += sum(len(g.rollouts) for g in batch.groups)
            model.train()
            learner.step(batch, sync.step)
            model.eval()
        t1 = time.perf_counter()
        if args.liar and args.index == args.islands - 1:
            lie(args.liar, model, sync.agreed)
        outcome = sync.sync(uuid.uuid4().hex)
        record["compute_s"].append(t1 - t0)
        record["sync_s"].append(time.perf_counter() - t1)
        record["sent_bytes"].append(outcome.sent_bytes)
        record["rollouts"].append(rollouts)
        record["optimizer_steps"].append(learner.optimizer_steps - steps_before)
        if outcome.leader and outcome.committed:
            snapshots.append((time.perf_counter() - started, sync.step, {k: v.clone() for k, v in model.state_dict().items()}))
    sync.close()
    record["parameters"] = [sum(p.numel() for p in model.parameters())]
    torch.save({"record": record, "snapshots": snapshots}, args.out / f"island-{args.index}.pt")


def run_islands(args: argparse.Namespace, out: Path) -> list[dict]:
    arguments = ["--islands", str(args.islands), "--sync-every", str(args.sync_every), "--groups", str(args.groups)]
    arguments += ["--seconds", str(args.seconds), "--start-at", str(time.time() + 20), "--min-islands", str(args.min_islands)]
    return run_island_processes(
        __file__, args.islands, args.min_islands, arguments + (["--liar", args.liar] if args.liar else []), out
    )


def liar_case(args: argparse.Namespace) -> int:
    if args.islands < 3 or args.min_islands < 3:
        raise SystemExit(
            "--liar needs --islands 3 --min-islands 3 or more: with fewer, a liar can cancel or, alone, take a step (see trainer.islands)"
        )
    lying = args.liar
    curves = {}
    for name, liar in (("honest islands", None), (f"one island lying ({lying})", lying)):
        with tempfile.TemporaryDirectory() as tmp:
            args.liar = liar
            print(f"{name}: {args.islands} processes, H = {args.sync_every}", flush=True)
            curves[name] = curve(agreed(run_islands(args, Path(tmp))), args.evals)
        print(f"{name:28s} " + "  ".join(f"{s:5.0f}s step {p:3d}: {a:.3f}" for s, p, a in curves[name]), flush=True)
    honest, lied = (points[-1][2] for points in curves.values())
    print(
        f"held-out accuracy at the end: honest {honest:.3f}, one liar {lied:.3f}: {(lied - honest) * 100:+.1f} points (goal: within 5)"
    )
    return 0


def agreed(results: list[dict]) -> list[Snapshot]:
    """The agreed weights of every published step, whichever island published it (the quorum's first changes)."""
    by_step = {snapshot[1]: snapshot for r in results for snapshot in r["snapshots"]}
    return sorted(by_step.values(), key=lambda snapshot: snapshot[0])


def curve(snapshots: list[Snapshot], evals: int) -> list[tuple[float, int, float]]:
    """(seconds, policy step, held-out accuracy) for an even sample of the snapshots, the last included."""
    model, tokenizer = load_model(DEFAULT_MODEL)
    problems = held_out_problems()
    pick = sorted({round(i * (len(snapshots) - 1) / max(1, evals - 1)) for i in range(evals)})
    out = []
    for i in pick:
        seconds, step, weights = snapshots[i]
        model.load_state_dict(weights)
        out.append((seconds, step, greedy_accuracy(model, tokenizer, problems)))
    return out


def reached(points: list[tuple[float, int, float]], accuracy: float) -> float | None:
    return next((s for s, _, a in points if a >= accuracy), None)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=180, help="training time of each configuration")
    parser.add_argument("--islands", type=int, default=2)
    parser.add_argument("--sync-every", type=int, default=4, help="H: inner steps between outer steps")
    parser.add_argument("--groups", type=int, default=16, help="groups a policy step of the one trainer learns from")
    parser.add_argument("--evals", type=int, default=10, help="policy steps evaluated per configuration")
    parser.add_argument("--island-index", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--lighthouse", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--start-at", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--liar", choices=["flip", "noise", "tiny"], help="compare honest islands with the last one lying")
    parser.add_argument("--min-islands", type=int, default=1, help="fewest islands whose pseudo-gradients an outer step judges")
    args = parser.parse_args()
    if args.island_index is not None:
        args.index = args.island_index
        island(args)
        return 0
    if args.liar:
        return liar_case(args)
    torch.set_num_threads(args.islands)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        print(
            f"islands: {args.islands} processes, H = {args.sync_every}, {args.groups // args.islands} groups an inner step each"
        )
        results = run_islands(args, out)
        print(f"one trainer: {args.islands} threads, {args.groups} groups a policy step")
        (out / "single").mkdir()
        single, _, _, _ = learn(out / "single", RUN, args.seconds, args.islands, TrainerSettings(groups_per_step=args.groups))
        island_curve, single_curve = curve(agreed(results), args.evals), curve(single, args.evals)

    for name, points in (("one trainer", single_curve), ("islands", island_curve)):
        print(f"{name:12s} " + "  ".join(f"{s:5.0f}s step {p:3d}: {a:.3f}" for s, p, a in points))

    records = [r["record"] for r in results]
    parameters = records[0]["parameters"][0]
    sent = sum(sum(r["sent_bytes"]) for r in records)
    rollouts = sum(sum(r["rollouts"]) for r in records)
    gradient_bytes = sum(4 * parameters * sum(r["optimizer_steps"]) for r in records)
    compute = sum(sum(r["compute_s"]) for r in records)
    waiting = sum(sum(r["sync_s"]) for r in records)
    outer_steps = len(records[0]["sync_s"])
    print(
        f"(a) bytes between islands per rollout: {sent / rollouts:,.0f} (bf16 pseudo-gradients every {args.sync_every} inner steps) "
        f"against {gradient_bytes / rollouts:,.0f} (fp32 gradients at every optimizer step): "
        f"{gradient_bytes / sent:.1f}x fewer (goal >= {args.sync_every}x, {2 * args.sync_every}x with bf16)"
    )
    common = min(max(a for *_, a in single_curve), max(a for *_, a in island_curve))
    base = single_curve[0][2]
    for gain in GAINS:
        if base + gain <= common:
            a, b = reached(single_curve, base + gain), reached(island_curve, base + gain)
            print(f"    to {base + gain:.3f} (+{gain * 100:.0f} points): one trainer {a:.0f} s, islands {b:.0f} s ({b / a:.2f}x)")
    t_single, t_islands = reached(single_curve, common), reached(island_curve, common)
    print(
        f"(b) held-out accuracy {common:.3f} (the highest both reach): one trainer at {t_single:.0f} s, islands at "
        f"{t_islands:.0f} s (goal: islands within 1.3x)"
    )
    share = compute / (compute + waiting)
    big_sync_s = big_all_reduce_s(args.islands)
    big_share = args.sync_every * BIG_INNER_STEP_S / (args.sync_every * BIG_INNER_STEP_S + big_sync_s)
    needed = 0.9 / 0.1 * big_sync_s / BIG_INNER_STEP_S
    print(
        f"(c) island time computing: {share:.1%} here ({outer_steps} outer steps, {waiting / outer_steps / len(records):.2f} s "
        f"an outer step waiting); projected, 7B over 1 Gbit/s ({big_sync_s:.0f} s a bf16 ring all-reduce, "
        f"{BIG_INNER_STEP_S} s an inner step): {big_share:.1%} at H = {args.sync_every}, 90 % from H = {needed:.0f} "
        "(goal >= 90 %)"
    )
    print(f"islands / one trainer, time to {common:.3f} held-out accuracy: {t_islands / t_single:.2f}x (goal <= 1.3)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
