"""``intellect-devnet``: a whole network on this machine, one process per role, on loopback.

For now: the coordinator (SQLite by default) with an arithmetic run on the shipped tiny
model, and N nodes with fresh wallets that lease its tasks, generate, prove and upload.
Later roles (shardcast origin and relay, validator, trainer) join the same process table.
"""

from __future__ import annotations

import json
import secrets
import tempfile
import time
from pathlib import Path
from typing import Annotated

import httpx
import typer
from rich.console import Console
from rich.live import Live
from rich.table import Table

from devnet.processes import (
    Process,
    StartError,
    admin_token,
    create_run,
    migrate,
    start_coordinator,
    start_node,
)
from shared.wallet import create_wallet

app = typer.Typer(help=__doc__, no_args_is_help=False, add_completion=False)
console = Console(soft_wrap=True)


@app.command()
def main(
    nodes: Annotated[int, typer.Option(min=1, max=32, help="Nodes to start, each with a fresh wallet.")] = 1,
    duration: Annotated[float, typer.Option(min=0, help="Seconds to run before stopping by itself; 0 runs until Ctrl-C.")] = 60,
    workdir: Annotated[
        Path | None, typer.Option(help="Where logs, wallets, the ledger and the summary go; default: a new temp dir.")
    ] = None,
    database_url: Annotated[
        str | None, typer.Option(help="Ledger URL (e.g. postgresql://...); default: SQLite in the workdir.")
    ] = None,
    heartbeat_interval: Annotated[float, typer.Option(min=0.1, help="Seconds between node heartbeats.")] = 2.0,
) -> None:
    """Start a coordinator and NODES nodes on loopback and show them live."""
    workdir = workdir or Path(tempfile.mkdtemp(prefix="intellect-devnet-"))
    workdir.mkdir(parents=True, exist_ok=True)
    database_url = database_url or f"sqlite:///{workdir / 'ledger.db'}"
    console.print(f"Devnet workdir: {workdir}")
    processes: list[Process] = []
    started = time.monotonic()
    try:
        migrate(database_url, workdir / "logs" / "migrate.log")
        token = admin_token(database_url)
        create_run(database_url, "devnet-arithmetic", workdir / "logs" / "run.log")
        (workdir / "admin-token").write_text(token + "\n")
        coordinator = start_coordinator(
            workdir,
            database_url,
            env={"INTELLECT_HEARTBEAT_INTERVAL_S": str(heartbeat_interval), "INTELLECT_BLOB_DIR": str(workdir / "blobs")},
        )
        processes.append(coordinator)
        console.print(f"Coordinator: {coordinator.url}  (admin token in {workdir / 'admin-token'})")

        # Wallets are encrypted like real ones; the devnet's shared password is in its workdir.
        password = secrets.token_urlsafe(16)
        (workdir / "wallet-password").write_text(password + "\n")
        for i in range(nodes):
            wallet = workdir / "wallets" / f"node-{i}.json"
            if not wallet.exists():
                create_wallet(wallet, password)
            processes.append(start_node(workdir, f"node-{i}", wallet, coordinator.url, password))

        _watch(coordinator, token, processes, duration)
    except StartError as e:
        console.print(f"[red]{e}[/red]")
        raise typer.Exit(1) from None
    finally:
        codes = {p.name: p.stop() for p in reversed(processes)}
        summary = {"workdir": str(workdir), "wall_time_s": round(time.monotonic() - started, 1), "exit_codes": codes}
        (workdir / "summary.json").write_text(json.dumps(summary, indent=2))
        console.print(f"Stopped. Logs, ledger and summary.json are in {workdir}")


def _watch(coordinator: Process, token: str, processes: list[Process], duration: float) -> None:
    deadline = time.monotonic() + duration if duration else float("inf")
    headers = {"authorization": f"Bearer {token}"}
    with Live(console=console, refresh_per_second=2) as live:
        try:
            while time.monotonic() < deadline:
                for p in processes:
                    if p.popen.poll() is not None:
                        raise StartError(f"{p.name} exited with code {p.popen.returncode}:\n{p.tail()}")
                listing = httpx.get(f"{coordinator.url}/v1/admin/nodes", headers=headers, timeout=5).json()
                live.update(_table(listing, duration, deadline))
                time.sleep(0.5)
        except KeyboardInterrupt:
            pass


def _table(listing: dict, duration: float, deadline: float) -> Table:
    left = f"{max(0.0, deadline - time.monotonic()):.0f} s left" if duration else "Ctrl-C to stop"
    counts = ", ".join(f"{k} {v}" for k, v in listing["counts"].items() if v)
    table = Table(
        "node",
        "status",
        "activity",
        "tasks done",
        "tokens/s",
        "last reward",
        title=f"Intellect devnet — {counts or 'no nodes yet'} — {left}",
    )
    for node in listing["nodes"]:
        beat = node.get("last_heartbeat") or {}
        metrics = beat.get("metrics", {})
        table.add_row(
            node["address"], node["status"], beat.get("activity", "-"),
            *(f"{metrics[k]:g}" if k in metrics else "-" for k in ("tasks_done", "tokens_per_s", "last_reward")),
        )  # fmt: skip
    return table
