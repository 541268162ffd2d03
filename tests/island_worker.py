"""One trainer island's outer loop on a small model, for the tests: ``python tests/island_worker.py NAME
LIGHTHOUSE OUT OUTER_STEPS [--fault nan|huge --fault-at K] [--pace S]``.

From the same initial weights every island takes ``sync_every`` AdamW steps on its own data, then meets
the others through :class:`trainer.islands.OuterSync`. It records, per outer meeting, the pseudo-gradient
it held (bf16, as sent), the outcome and the agreed weights after, in ``OUT/NAME.pt`` (rewritten after
every meeting, so a killed island leaves what it did)."""

from __future__ import annotations

import argparse
import time
import uuid
from pathlib import Path

import torch

from intellect_protocol.shared.island_schemas import OuterSettings
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
    parser.add_argument("--fault", choices=["nan", "huge"])
    parser.add_argument("--fault-at", type=int, default=1)
    parser.add_argument("--pace", type=float, default=0.0, help="seconds of sleep per inner step")
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = initial_model()
    inner = torch.optim.AdamW(model.parameters(), lr=0.01)
    sync = OuterSync(model, args.name, args.lighthouse, SETTINGS, timeout_s=20)
    data = torch.Generator().manual_seed(sum(args.name.encode()))
    record: dict[str, list] = {"pseudo": [], "outcomes": [], "agreed": []}
    while sync.step < args.outer_steps:
        for _ in range(SETTINGS.sync_every):
            x = torch.randn(16, 8, generator=data)
            loss = (model(x) - x.flip(-1)).pow(2).mean()
            inner.zero_grad()
            loss.backward()
            inner.step()
            time.sleep(args.pace)
        if args.fault and sync.step == args.fault_at:
            with torch.no_grad():
                model[0].weight.mul_(float("nan") if args.fault == "nan" else 1e4)
        pseudo = torch.cat([(a - p.detach()).flatten() for a, p in zip(sync.agreed, model.parameters())]).to(WIRE)
        outcome = sync.sync(uuid.uuid4().hex)
        record["pseudo"].append(pseudo)
        record["outcomes"].append(outcome)
        record["agreed"].append([a.clone() for a in sync.agreed])
        torch.save(record, args.out / f"{args.name}.pt.tmp")
        (args.out / f"{args.name}.pt.tmp").replace(args.out / f"{args.name}.pt")
    sync.close()


if __name__ == "__main__":
    main()
