"""``intellect-devnet --pretrain``: the network pretraining the shipped METAGENE-shaped example from scratch.

It makes the synthetic metagenomic corpus, tokenizer and model in the workdir (:mod:`shared.pretraining.metagenome`),
judges the untrained model on the held-out and out-of-distribution reads, creates a pretraining run on the corpus
(``run create --kind pretrain``: its shards checked and put in the coordinator's blob store) and starts the
coordinator, the shardcast origin and relay, a lighthouse, the trainer islands and a validator, which replays the
islands' outer steps the run draws for audit (:data:`AUDIT_RATE` of them); no node, since a pretraining run has no
rollouts. The islands learn every shard once an epoch and stop once the corpus is learnt; the devnet waits for the
audits drawn to be decided. ``summary.json`` records the held-out loss, perplexity and out-of-distribution AUROC
before and after and by step, the tokens trained, and each island's share and audits.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.live import Live
from rich.table import Table

from intellect_protocol.devnet.network import Network, start_network
from intellect_protocol.devnet.processes import StartError

SYNC_EVERY = 16
"""Inner steps between the islands' outer steps (whole shards: an outer step ends with the shard it is in)."""
EPOCHS = 2
RUN_NAME = "devnet-metagenome"
AUDIT_RATE = 0.5
"""Share of the islands' pseudo-gradients the validator replays: more than a real run's, to show audits in a short one."""
AUDITS_WAIT_S = 60.0
"""How long the devnet waits, once the islands stop, for the audits drawn to be decided."""


def judge_untrained(example: Path) -> dict[str, float]:
    """The example's untrained model on its held-out and out-of-distribution reads."""
    import torch
    from transformers import AutoModelForCausalLM

    from intellect_protocol.shared.pretraining.corpus import load_shard
    from intellect_protocol.shared.pretraining.evaluation import evaluate
    from intellect_protocol.shared.pretraining.manifest import load_manifest

    torch.set_num_threads(1)
    manifest = load_manifest(example / "corpus")
    held_out = load_shard(example / "corpus", manifest.held_out, manifest)
    ood_ref = manifest.out_of_distribution
    ood = None if ood_ref is None else load_shard(example / "corpus", ood_ref, manifest)
    model = AutoModelForCausalLM.from_pretrained(example / "model", local_files_only=True)
    return evaluate(model, held_out, ood, manifest.pad_id).model_dump(exclude_none=True)


def start(workdir: Path, islands: int, database_url: str | None, console: Console) -> tuple[Network, dict[str, float]]:
    """The example made (once per workdir) and judged untrained, then the network started on it."""
    from intellect_protocol.shared.pretraining.metagenome import MetagenomeSpec, make

    example = workdir / "metagenome"
    if not (example / "metagenome.json").is_file():
        console.print("Making the metagenomic example (corpus, tokenizer, model)...")
        make(example, MetagenomeSpec())
    before = judge_untrained(example)
    options = ["--kind", "pretrain", "--corpus", str(example / "corpus"), "--model", str(example / "model")]
    options += ["--epochs", str(EPOCHS), "--sync-every", str(SYNC_EVERY), "--island-audit-rate", str(AUDIT_RATE)]
    options += ["--island-audit-second-opinion", "0"]  # one validator: nobody could give a second opinion
    network = start_network(
        workdir,
        nodes=0,
        validators=1,
        database_url=database_url,
        run_options=options,
        islands=islands,
        run_name=RUN_NAME,
        keep_steps=1000,  # every step stays downloadable: an audit replays from the step its round started from
    )
    return network, before


def watch(network: Network, console: Console) -> None:
    """Show the run until every island has stopped (the corpus is learnt) and the audits drawn are decided (or
    :data:`AUDITS_WAIT_S` passed); StartError if a role fails."""
    stopped: float | None = None
    with Live(console=console, refresh_per_second=2) as live:
        while True:
            islands = [p for p in network.processes if p.name.startswith("island-")]
            for p in network.processes:
                if p.popen.poll() is not None and not (p in islands and p.popen.returncode == 0):
                    raise StartError(f"{p.name} exited with code {p.popen.returncode}:\n{p.tail()}")
            live.update(_dashboard(network))
            if all(p.popen.poll() is not None for p in islands):
                stopped = stopped or time.monotonic()
                if not _undecided(network) or time.monotonic() - stopped > AUDITS_WAIT_S:
                    return
            time.sleep(0.5)


def _undecided(network: Network) -> int:
    """Audits of the run drawn and not decided yet."""
    islands = network.http.get(f"{network.coordinator.url}/v1/public/runs/{network.run_id}/islands", timeout=5).json()
    return sum(n for i in islands for state, n in (i["audits"] or {}).items() if state in ("awaiting_upload", "open"))


def summary(network: Network, before: dict[str, float]) -> dict[str, Any]:
    """The run's progress: held-out figures before and after and by step, tokens trained, the islands' shares."""
    url = f"{network.coordinator.url}/v1/public/runs/{network.run_id}"
    steps = network.http.get(f"{url}/progress", timeout=10).json()["steps"]
    judged = [s for s in steps if "held_out_loss" in s]
    islands = network.http.get(f"{url}/islands", timeout=10).json()
    out: dict[str, Any] = {
        "policy_step": int(steps[-1]["step"]) if steps else 0,
        "tokens_trained": sum(i["tokens"] or 0 for i in islands),
        "held_out_before": before,
        "held_out_loss_before": before["held_out_loss"],
        "held_out_by_step": {
            int(s["step"]): {k: s[k] for k in ("held_out_loss", "perplexity", "ood_auroc") if k in s} for s in judged
        },
        "islands": islands,
        "audits": {
            state: sum((i["audits"] or {}).get(state, 0) for i in islands)
            for state in ("passed", "failed", "open", "awaiting_upload")
        },
    }
    if judged:
        out["held_out_loss_after"] = judged[-1]["held_out_loss"]
        out["held_out_after"] = out["held_out_by_step"][int(judged[-1]["step"])]
    return out


def _dashboard(network: Network) -> Table:
    url = f"{network.coordinator.url}/v1/public/runs/{network.run_id}"
    steps = network.http.get(f"{url}/progress", timeout=5).json()["steps"]
    latest = steps[-1] if steps else {}
    table = Table.grid(padding=(0, 2))
    table.add_row(
        "policy step", str(int(latest.get("step", 0))), "tokens trained", str(int(sum(s.get("tokens", 0) for s in steps)))
    )
    table.add_row(
        "held-out loss", f"{latest['held_out_loss']:.3f}" if "held_out_loss" in latest else "-",
        "out-of-distribution AUROC", f"{latest['ood_auroc']:.3f}" if "ood_auroc" in latest else "-",
    )  # fmt: skip
    table.add_row("leaderboard", f"{network.coordinator.url}/", "", "")
    return table


def run(workdir: Path, islands: int, database_url: str | None, console: Console) -> int:
    """The pretraining devnet from start to ``summary.json``; its exit code (1: a role failed)."""
    started = time.monotonic()
    network: Network | None = None
    before: dict[str, float] = {}
    failed = False
    try:
        network, before = start(workdir, islands, database_url, console)
        console.print(f"Leaderboard: [bold]{network.coordinator.url}/[/bold]  (islands' logs in {workdir / 'logs'})")
        watch(network, console)
    except StartError as e:
        console.print(f"{e}", style="red", markup=False)
        failed = True
    except KeyboardInterrupt:
        pass
    finally:
        found: dict[str, Any] = {"workdir": str(workdir), "wall_time_s": round(time.monotonic() - started, 1)}
        if network is not None:
            try:
                found |= summary(network, before)
            except httpx.HTTPError:
                pass  # the coordinator is gone: the exit codes say why
            found["exit_codes"] = network.stop(console=console)
        (workdir / "summary.json").write_text(json.dumps(found, indent=2))
    console.print(f"Stopped. Logs, ledger and summary.json are in {workdir}")
    if "held_out_loss_after" in found:
        console.print(
            f"Held-out loss {found['held_out_loss_before']:.3f} before pretraining -> {found['held_out_loss_after']:.3f} at "
            f"policy step {found['policy_step']}, {found['tokens_trained']} tokens trained; "
            f"island audits: {found['audits']['passed']} passed, {found['audits']['failed']} failed."
        )
    return 1 if failed else 0
