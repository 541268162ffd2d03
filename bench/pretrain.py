"""Pretraining across trainer islands against one trainer process, on the shipped metagenomic example
(:mod:`shared.pretraining.metagenome`, made here by its script), same cores, same wall clock:

- **one trainer**: one process with one torch thread per island, inner steps of ``--batch-rows`` rows over every
  shard in turn (:func:`shared.pretraining.learning.learn_shard`);
- **islands**: ``--islands`` processes (one thread each) meeting through a real torchft lighthouse
  (:class:`trainer.islands.OuterSync`, the robust outer step RL islands take): island ``i`` learns from shards
  ``i, i + k, ...`` of every epoch, ``--batch-rows / islands`` rows an inner step, and they take an outer step
  every ``--sync-every`` inner steps, their inner AdamW fresh at each as a run's ``fresh_inner`` (which audits need)
  has it (``--no-reset-inner``: carried). The shards are split here as the coordinator would hand them out (each to
  one island an epoch); the coordinator is not in the loop.

Afterwards each configuration's agreed weights are evaluated on the held-out reads: the islands' after every outer
step, the one trainer's every ``--sync-every`` inner steps (as many rows apart). Printed, against issue #47's goals:

(a) bytes sent between islands against the same islands all-reducing fp32 gradients at every inner step
    (counted from the parameters and the steps taken, not sent): goal at least 100x fewer;
(b) the time each configuration needed to reach the lowest held-out loss both reach, and the curves: goal
    islands within 1.2x the one trainer's time (also printed on the way down, at 50, 75 and 90 % of the drop).

With ``--liar flip|noise|tiny`` (``--islands 3`` or more) it runs honest islands, then the same islands with the
last one lying at every outer step, once averaged by the coordinate-wise median alone and once with directions
screened (``OuterSettings.screen_directions``), and prints the final held-out losses (goal: within 5 %).

With ``--compare-overlap --link-mbit R`` it runs the islands over an emulated link of ``R`` Mbit/s (each meeting lasts
as long as its ring all-reduce would on it), meeting after each round, then with each meeting overlapping the next
round (Streaming DiLoCo's overlap, :meth:`trainer.islands.OuterSync.launch`): the share of time computing measured,
the held-out loss by time, and both projected to a 7B model over 1 Gbit/s (goal >= 90 % computing at H <= 100).

With ``--compare-reset`` it runs the islands with their inner AdamW state carried across outer steps, then reset at
every outer step (what replaying one outer step from the agreed weights alone assumes), and prints both curves.

    python bench/pretrain.py [--seconds 180] [--islands 2] [--sync-every 100] [--batch-rows 16] [--outer-lr 1 --outer-momentum 0] [--liar flip | --compare-reset | --compare-overlap --link-mbit R]
"""

from __future__ import annotations

import argparse
import copy
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, cast

import torch
from _islands import BIG_INNER_STEP_S, big_all_reduce_s, run_island_processes
from transformers import AutoModelForCausalLM, PreTrainedModel

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from intellect_protocol.devnet.island_lies import lie  # noqa: E402
from intellect_protocol.shared.island_schemas import OuterSettings  # noqa: E402
from intellect_protocol.shared.pretraining.corpus import load_shard  # noqa: E402
from intellect_protocol.shared.pretraining.evaluation import evaluate  # noqa: E402
from intellect_protocol.shared.pretraining.learning import batches, inner_step, optimizer_for  # noqa: E402
from intellect_protocol.shared.pretraining.manifest import load_manifest  # noqa: E402
from intellect_protocol.shared.pretraining.metagenome import MetagenomeSpec, make  # noqa: E402
from intellect_protocol.shared.pretraining.settings import PretrainSettings  # noqa: E402
from intellect_protocol.trainer.islands import OuterStep, OuterSync  # noqa: E402

Snapshot = tuple[float, dict[str, torch.Tensor]]


def _load(example: Path) -> PreTrainedModel:
    model: PreTrainedModel = AutoModelForCausalLM.from_pretrained(example / "model", local_files_only=True)
    return model


class SlowLink(OuterSync):
    """An island whose meetings take as long as their all-reduce would over a link of ``link_bytes_per_s`` (a ring
    all-reduce of every island's slot: each island sends and receives ``2 (n - 1) / n`` of them), on top of loopback's."""

    link_bytes_per_s: float = float("inf")

    def _meet(self, attempt: str, contribute: bool, pseudo: torch.Tensor) -> OuterStep:
        outcome = super()._meet(attempt, contribute, pseudo)
        n = outcome.participants
        time.sleep(2 * (n - 1) / n * outcome.sent_bytes / self.link_bytes_per_s)
        return outcome


def learner(example: Path, shards: list[int], batch_rows: int, seconds: float, start_at: float, every: int, sync: OuterSync | None = None, liar: str | None = None, reset_inner: bool = False, overlap: bool = False) -> dict[str, Any]:  # fmt: skip
    """Inner steps over ``shards`` (indices into the corpus' training shards) in turn, epoch after epoch, for
    ``seconds`` from ``start_at``; with ``sync``, an outer step every ``every`` inner steps (``liar``: lying at each;
    ``reset_inner``: a fresh inner AdamW after each; ``overlap``: each meeting overlapping the next round). The agreed
    weights after each outer step (every ``every`` steps without ``sync``), timed, and the steps taken."""
    manifest = load_manifest(example / "corpus")
    rows = [load_shard(example / "corpus", manifest.shards[i], manifest) for i in shards]
    model = cast(PreTrainedModel, sync.model) if sync is not None else _load(example)
    settings = PretrainSettings(batch_rows=batch_rows)
    optimizer = optimizer_for(model, settings)
    record: dict[str, Any] = {"snapshots": [(0.0, _copy(model))], "steps": 0, "sent_bytes": 0, "compute_s": 0.0, "sync_s": 0.0}
    time.sleep(max(0.0, start_at - time.time()))  # one clock for every island: they stop after the same outer step
    started = time.perf_counter() - (time.time() - start_at)
    epoch = 0
    while time.perf_counter() - started < seconds:
        for shard in rows:
            for ids in batches(shard, settings, epoch):
                t0 = time.perf_counter()
                inner_step(model, optimizer, ids, manifest.pad_id, settings)
                record["steps"] += 1
                record["compute_s"] += time.perf_counter() - t0
                if sync is None and (record["steps"] % every == 0 or time.perf_counter() - started >= seconds):
                    record["snapshots"].append((time.perf_counter() - started, _copy(model)))
                    if time.perf_counter() - started >= seconds:
                        return record
                if sync is None or record["steps"] % every:
                    continue
                t1 = time.perf_counter()
                if liar:
                    lie(liar, model, sync.agreed)
                if overlap:
                    done = sync.wait()
                    sync.launch(uuid.uuid4().hex, contribute=sync.started_from_record(done))
                else:
                    done = sync.sync(uuid.uuid4().hex)
                if reset_inner:  # what an auditor replaying one outer step from the agreed weights alone would take
                    optimizer = optimizer_for(model, settings)
                record["sync_s"] += time.perf_counter() - t1
                _landed(record, done, sync, time.perf_counter() - started)
                if time.perf_counter() - started >= seconds:
                    if overlap:
                        t1 = time.perf_counter()
                        done = sync.finish()
                        record["sync_s"] += time.perf_counter() - t1
                        _landed(record, done, sync, time.perf_counter() - started)
                    return record
        epoch += 1
    return record


def _landed(record: dict[str, Any], outcome: OuterStep | None, sync: OuterSync, at: float) -> None:
    """A meeting's bytes, and the agreed weights it left if this island led it (overlapped, the model holds the next
    round's start, not them)."""
    if outcome is not None:
        record["sent_bytes"] += outcome.sent_bytes
        if outcome.leader and outcome.committed:
            agreed = copy.deepcopy(sync.model)
            with torch.no_grad():
                for p, weights in zip([p for p in agreed.parameters() if p.requires_grad], sync.agreed, strict=True):
                    p.copy_(weights)
            record["snapshots"].append((at, _copy(agreed)))


def _copy(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _outer(args: argparse.Namespace) -> OuterSettings:
    given = {"outer_lr": args.outer_lr, "outer_momentum": args.outer_momentum, "screen_directions": args.screen}
    return OuterSettings(
        sync_every=args.sync_every, min_islands=args.min_islands, **{k: v for k, v in given.items() if v is not None}
    )


def island(args: argparse.Namespace) -> None:
    """One island (a child process): writes ``OUT/island-I.pt``."""
    torch.set_num_threads(1)
    shards = list(range(args.island_index, len(load_manifest(args.example / "corpus").shards), args.islands))
    model = _load(args.example)
    outer = _outer(args)
    sync = SlowLink(model, f"island-{args.island_index}", args.lighthouse, outer, timeout_s=600)
    sync.link_bytes_per_s = args.link_mbit * 1e6 / 8 if args.link_mbit else float("inf")
    liar = args.liar if args.island_index == args.islands - 1 else None
    record = learner(
        args.example, shards, args.batch_rows // args.islands, args.seconds, args.start_at, args.sync_every, sync, liar,
        args.reset_inner, args.overlap,
    )  # fmt: skip
    sync.close()
    record["parameters"] = sum(p.numel() for p in model.parameters())
    torch.save(record, args.out / f"island-{args.island_index}.pt")


def run_islands(args: argparse.Namespace, out: Path) -> list[dict[str, Any]]:
    arguments = ["--example", str(args.example), "--islands", str(args.islands), "--sync-every", str(args.sync_every)]
    arguments += ["--batch-rows", str(args.batch_rows), "--seconds", str(args.seconds), "--start-at", str(time.time() + 20)]
    arguments += ["--min-islands", str(args.min_islands), *(["--liar", args.liar] if args.liar else [])]
    arguments += [f"--{k.replace('_', '-')}={v}" for k in ("outer_lr", "outer_momentum") if (v := getattr(args, k)) is not None]
    arguments += [] if args.screen is None else ["--screen" if args.screen else "--no-screen"]
    arguments += ["--reset-inner" if args.reset_inner else "--no-reset-inner"]
    arguments += ["--overlap"] if args.overlap else []
    arguments += ["--link-mbit", str(args.link_mbit)] if args.link_mbit else []
    return run_island_processes(__file__, args.islands, args.min_islands, arguments, out)


def curve(example: Path, snapshots: list[Snapshot], evals: int | None) -> list[tuple[float, float]]:
    """(seconds, held-out loss) for every one of ``snapshots``, or an even sample of ``evals`` of them (the first and
    last included)."""
    manifest = load_manifest(example / "corpus")
    held_out = load_shard(example / "corpus", manifest.held_out, manifest)
    model = _load(example)
    evals = evals or len(snapshots)
    pick = sorted({round(i * (len(snapshots) - 1) / max(1, evals - 1)) for i in range(evals)})
    points = []
    for i in pick:
        seconds, weights = snapshots[i]
        model.load_state_dict(weights)
        points.append((seconds, evaluate(model, held_out, None, manifest.pad_id).held_out_loss))
    return points


def agreed(results: list[dict[str, Any]]) -> list[Snapshot]:
    """The agreed weights after every committed outer step, whichever island led it, in time order."""
    return sorted((s for r in results for s in r["snapshots"]), key=lambda s: s[0])


def reached(points: list[tuple[float, float]], loss: float) -> float | None:
    return next((s for s, value in points if value <= loss), None)


def _show(name: str, points: list[tuple[float, float]]) -> None:
    print(f"{name:28s} " + "  ".join(f"{s:5.0f}s {loss:.3f}" for s, loss in points), flush=True)


def liar_case(args: argparse.Namespace) -> int:
    if args.islands < 3 or args.min_islands < 3:
        raise SystemExit("--liar needs --islands 3 --min-islands 3 or more (see trainer.islands)")
    lying, finals = args.liar, {}
    cases = (("honest islands", None, None), ("one liar, median only", lying, False), ("one liar, screened", lying, True))
    for name, liar, screen in cases:
        args.liar, args.screen = liar, screen
        with tempfile.TemporaryDirectory() as tmp:
            points = curve(args.example, agreed(run_islands(args, Path(tmp))), args.evals)
        _show(name, points)
        finals[name] = points[-1][1]
    honest, median, screened = finals.values()
    print(
        f"held-out loss at the end: honest {honest:.3f}, one liar ({lying}) with the median only {median:.3f} ({(median / honest - 1) * 100:+.1f} %)"
    )
    print(
        f"one liar ({lying}) with directions screened: {screened:.3f}, {(screened / honest - 1) * 100:+.1f} % against the honest islands (goal: within 5 %)"
    )
    return 0


def reset_case(args: argparse.Namespace) -> int:
    """The same islands with their inner AdamW state carried across outer steps, then reset at each: what an audit
    that replays one outer step from the agreed weights alone would cost the run."""
    curves = {}
    for name, reset in (("inner state carried", False), ("inner state reset", True)):
        args.reset_inner = reset
        with tempfile.TemporaryDirectory() as tmp:
            curves[name] = curve(args.example, agreed(run_islands(args, Path(tmp))), args.evals)
        _show(name, curves[name])
    carried, reset = curves.values()
    common = max(min(loss for _, loss in carried), min(loss for _, loss in reset))
    t_carried, t_reset = reached(carried, common), reached(reset, common)
    assert t_carried is not None and t_reset is not None
    print(
        f"held-out loss at the end: carried {carried[-1][1]:.3f}, reset {reset[-1][1]:.3f} ({(reset[-1][1] / carried[-1][1] - 1) * 100:+.1f} %)"
    )
    print(f"reset / carried, time to {common:.3f} held-out loss: {t_reset / max(t_carried, 1e-9):.2f}x")
    return 0


def overlap_case(args: argparse.Namespace) -> int:
    """The same islands over a link of ``--link-mbit``, meeting after each round, then with each meeting overlapping
    the next round: the share of time computing, and the held-out loss by time."""
    curves, shares = {}, {}
    for name, overlap in (("plain outer steps", False), ("overlapped", True)):
        args.overlap = overlap
        with tempfile.TemporaryDirectory() as tmp:
            results = run_islands(args, Path(tmp))
            curves[name] = curve(args.example, agreed(results), args.evals)
        compute, waiting = sum(r["compute_s"] for r in results), sum(r["sync_s"] for r in results)
        shares[name] = compute / (compute + waiting)
        _show(name, curves[name])
        print(f"{'':28s} time computing {shares[name]:.1%}, {sum(r['steps'] for r in results)} inner steps", flush=True)
    plain, overlapped = curves.values()
    common = max(min(loss for _, loss in plain), min(loss for _, loss in overlapped))
    t_plain, t_overlapped = reached(plain, common), reached(overlapped, common)
    assert t_plain is not None and t_overlapped is not None
    print(f"held-out loss at the end: plain {plain[-1][1]:.3f}, overlapped {overlapped[-1][1]:.3f}")
    print(f"overlapped / plain, time to {common:.3f} held-out loss: {t_overlapped / max(t_plain, 1e-9):.2f}x")
    round_s, link_s = args.sync_every * BIG_INNER_STEP_S, big_all_reduce_s(args.islands)
    print(
        f"projected, 7B over 1 Gbit/s ({link_s:.0f} s a bf16 ring all-reduce, {BIG_INNER_STEP_S} s an inner step, H = "
        f"{args.sync_every}): plain {round_s / (round_s + link_s):.1%}, overlapped {round_s / max(round_s, link_s):.1%} computing (goal >= 90 %)"
    )
    print(
        f"time computing, overlapped against plain, over {args.link_mbit} Mbit/s: {shares['overlapped']:.1%} against {shares['plain outer steps']:.1%}"
    )
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=180, help="training time of each configuration")
    parser.add_argument("--islands", type=int, default=2)
    parser.add_argument("--sync-every", type=int, default=100, help="H: inner steps between outer steps")
    parser.add_argument("--batch-rows", type=int, default=16, help="rows an inner step of the one trainer learns from")
    parser.add_argument(
        "--evals",
        type=int,
        help="agreed weights evaluated per configuration (default: all, one an outer step; a sample"
        " reads each curve's times only to the sample's spacing)",
    )
    parser.add_argument("--liar", choices=["flip", "noise", "tiny"], help="compare honest islands with the last one lying")
    parser.add_argument("--min-islands", type=int, default=1, help="fewest islands whose pseudo-gradients an outer step judges")
    parser.add_argument("--outer-lr", type=float, help="the outer step's learning rate (default: the run setting's, by H)")
    parser.add_argument("--outer-momentum", type=float, help="the outer step's Nesterov momentum (default: by H)")
    parser.add_argument("--screen", action=argparse.BooleanOptionalAction, help="screen directions (default: by H)")
    parser.add_argument(
        "--reset-inner", action=argparse.BooleanOptionalAction, default=PretrainSettings().fresh_inner,
        help="a fresh inner AdamW after every outer step (default: as a run's fresh_inner, which audits need)",
    )  # fmt: skip
    parser.add_argument("--compare-reset", action="store_true", help="islands with the inner state carried, then reset")
    parser.add_argument("--overlap", action="store_true", help="each meeting overlaps the next round (Streaming DiLoCo)")
    parser.add_argument("--link-mbit", type=float, help="emulate a link of this many Mbit/s between islands")
    parser.add_argument("--compare-overlap", action="store_true", help="plain outer steps, then overlapped, over --link-mbit")
    parser.add_argument("--example", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--island-index", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--lighthouse", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--start-at", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.island_index is not None:
        island(args)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        args.example = Path(tmp) / "example"
        torch.set_num_threads(1)
        print("making the metagenomic example ...", flush=True)
        make(args.example, MetagenomeSpec())
        if args.liar:
            return liar_case(args)
        if args.compare_reset:
            return reset_case(args)
        if args.compare_overlap:
            if not args.link_mbit:
                raise SystemExit("--compare-overlap needs --link-mbit: the link whose waiting the overlap hides")
            return overlap_case(args)
        outer = _outer(args)
        print(
            f"islands: {args.islands} processes, H = {args.sync_every}, outer lr {outer.outer_lr} and momentum "
            f"{outer.outer_momentum}, {args.batch_rows // args.islands} rows a step each, inner AdamW "
            f"{'fresh at every outer step' if args.reset_inner else 'carried across outer steps'}",
            flush=True,
        )
        results = run_islands(args, Path(tmp))
        print(f"one trainer: {args.islands} threads, {args.batch_rows} rows a step", flush=True)
        torch.set_num_threads(args.islands)
        shards = list(range(len(load_manifest(args.example / "corpus").shards)))
        single = learner(args.example, shards, args.batch_rows, args.seconds, time.time(), args.sync_every)
        torch.set_num_threads(1)
        island_curve, single_curve = (
            curve(args.example, agreed(results), args.evals),
            curve(args.example, single["snapshots"], args.evals),
        )

    _show("one trainer", single_curve)
    _show("islands", island_curve)
    single_rate = single["steps"] * args.batch_rows / args.seconds
    islands_rate = sum(r["steps"] for r in results) * (args.batch_rows // args.islands) / args.seconds
    print(f"rows learnt a second: one trainer {single_rate:.1f}, islands {islands_rate:.1f}")
    if single_rate < islands_rate / 2:
        raise SystemExit(
            "the one trainer ran at under half the islands' rate: the machine was busy with something else; run again"
        )
    parameters, sent = results[0]["parameters"], sum(r["sent_bytes"] for r in results)
    gradient_bytes = sum(4 * parameters * r["steps"] for r in results)
    print(
        f"(a) bytes between islands: {sent:,} (bf16 pseudo-gradients every {args.sync_every} inner steps) against "
        f"{gradient_bytes:,} (fp32 gradients at every inner step): {gradient_bytes / sent:.0f}x fewer (goal >= 100x)"
    )
    compute = sum(r["compute_s"] for r in results)
    waiting = sum(r["sync_s"] for r in results)
    print(f"    island time computing: {compute / (compute + waiting):.1%}{' (meetings overlapped)' if args.overlap else ''}")
    common = max(min(loss for _, loss in single_curve), min(loss for _, loss in island_curve))
    first = single_curve[0][1]
    for share in (0.5, 0.75, 0.9):  # on the way down, where the one trainer has not begun to overfit
        loss = first - share * (first - common)
        t_single, t_islands = reached(single_curve, loss), reached(island_curve, loss)
        assert t_single is not None and t_islands is not None
        print(
            f"    {share:.0%} of the way down, held-out loss {loss:.3f}: islands / one trainer {t_islands / max(t_single, 1e-9):.2f}x"
        )
    t_single, t_islands = reached(single_curve, common), reached(island_curve, common)
    assert t_single is not None and t_islands is not None
    print(
        f"(b) held-out loss {common:.3f} (the lowest both reach): one trainer at {t_single:.0f} s, islands at {t_islands:.0f} s"
    )
    print(f"islands / one trainer, time to {common:.3f} held-out loss: {t_islands / max(t_single, 1e-9):.2f}x (goal <= 1.2)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
