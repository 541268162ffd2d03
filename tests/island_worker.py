"""One trainer island's outer loop on a small model, for the tests: ``python tests/island_worker.py NAME
LIGHTHOUSE OUT OUTER_STEPS [--fault nan@K huge@K ahead@K ...] [--refuse-heals]``, or as an island of FSDP ranks
under ``torchrun --nproc-per-node N``.

From the same initial weights every island takes ``sync_every`` AdamW steps on its own data, then meets
the others through :class:`trainer.islands.OuterSync`. It records, per outer meeting, the pseudo-gradient
it held (bf16, as sent), the outcome and the agreed weights after, in ``OUT/NAME.pt`` (``OUT/NAME-RANK.pt``
for a rank of FSDP: its shard of each), rewritten after every meeting."""

from __future__ import annotations

import argparse
import copy
import uuid
from pathlib import Path

import torch

from intellect_protocol.devnet.island_lies import lie
from intellect_protocol.shared.island_schemas import OuterSettings
from intellect_protocol.trainer.distributed import placement, shard
from intellect_protocol.trainer.islands import WIRE, OuterSync

SETTINGS = OuterSettings(sync_every=3, outer_lr=0.7, outer_momentum=0.9)


def initial_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 8))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("name")
    parser.add_argument("lighthouse")
    parser.add_argument("out", type=Path)
    parser.add_argument("outer_steps", type=int)
    parser.add_argument(
        "--fault", nargs="*", default=[], help="KIND@STEP: a lie before that meeting (devnet.island_lies, or ahead: see below)"
    )
    parser.add_argument("--refuse-heals", action="store_true", help="judge every peer's state not the run's agreed one")
    parser.add_argument("--overlap", action="store_true", help="each meeting overlaps the next round (OuterSync.launch)")
    parser.add_argument("--keep-sent", action="store_true", help="as in an audited run: record what each meeting kept")
    args = parser.parse_args()
    torch.set_num_threads(1)
    faults = {int(step): kind for kind, step in (f.split("@") for f in args.fault)}
    where = placement()
    model = shard(initial_model(), where)  # FSDP across the island's ranks, when it has several
    inner = torch.optim.AdamW(model.parameters(), lr=0.01)
    check = (lambda: False) if args.refuse_heals else None
    sync = OuterSync(
        model,
        args.name,
        args.lighthouse,
        SETTINGS,
        timeout_s=20,
        rank=where.rank,
        world_size=where.world_size,
        check_heal=check,
        keep_sent=args.keep_sent,
    )
    out = args.out / (f"{args.name}-{where.rank}.pt" if where.world_size > 1 else f"{args.name}.pt")
    data = torch.Generator().manual_seed(sum(args.name.encode()))  # the same on an island's ranks: FSDP splits no data
    record: dict[str, list] = {"pseudo": [], "outcomes": [], "agreed": [], "initial": [a.clone() for a in sync.agreed]}
    if args.overlap:
        overlapped(model, inner, sync, data, args.outer_steps, record, out)
        return
    while sync.step < args.outer_steps:
        learn(model, inner, data)
        honest = None
        if (kind := faults.pop(sync.step, None)) == "ahead":
            # For one meeting, claims the next step with weights nobody agreed on: torchft has every island
            # behind it recover them. Then it is honest again, back at its step.
            honest = (copy.deepcopy(sync.state_dict()), sync.manager.state_dict())
            sync.manager.load_state_dict({"step": sync.step + 1, "batches_committed": 0})
            with torch.no_grad():
                for a in sync.agreed:
                    a.mul_(1000)
        elif kind is not None:
            lie(kind, model, sync.agreed)
        pseudo = torch.cat([(a - p.detach()).flatten() for a, p in zip(sync.agreed, model.parameters())]).to(WIRE)
        outcome = sync.sync(uuid.uuid4().hex)
        if honest is not None:
            sync.load_state_dict(honest[0])
            sync.manager.load_state_dict(honest[1])
        record["pseudo"].append(pseudo)
        record["outcomes"].append(outcome)
        record["agreed"].append([a.clone() for a in sync.agreed])
        record["kept"] = dict(sync.sent)
        torch.save(record, out.with_suffix(".tmp"))
        out.with_suffix(".tmp").replace(out)
    sync.close()


def learn(model: torch.nn.Module, inner: torch.optim.Optimizer, data: torch.Generator) -> None:
    for _ in range(SETTINGS.sync_every):
        x = torch.randn(16, 8, generator=data)
        loss = (model(x) - x.flip(-1)).pow(2).mean()
        inner.zero_grad()
        loss.backward()
        inner.step()


def overlapped(model: torch.nn.Module, inner: torch.optim.Optimizer, sync: OuterSync, data: torch.Generator, rounds: int, record: dict[str, list], out: Path) -> None:  # fmt: skip
    """``rounds`` rounds whose meetings overlap the next round: records each round's start and pseudo-gradient, and each
    meeting's outcome and agreed weights as it lands."""
    record["start"] = []
    for k in range(rounds + 1):
        if k < rounds:
            record["start"].append([s.clone() for s in sync.start or sync.agreed])
            learn(model, inner, data)
            record["pseudo"].append(
                torch.cat([(s - p.detach()).flatten() for s, p in zip(record["start"][-1], model.parameters())]).to(WIRE)
            )
        landed = sync.wait() if k < rounds else sync.finish()
        if landed is not None:
            record["outcomes"].append(landed)
            record["agreed"].append([a.clone() for a in sync.agreed])  # before the next meeting changes them
        if k < rounds:
            sync.launch(uuid.uuid4().hex, contribute=sync.started_from_record(landed))
    torch.save(record, out)
    sync.close()


if __name__ == "__main__":
    main()
