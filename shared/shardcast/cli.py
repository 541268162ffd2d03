"""``intellect-relay``: serve policy steps to nodes, as a relay (fetching from upstreams) or as
the trainer's origin (serving the files the trainer writes in place)."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import Annotated

import typer
import uvicorn
from rich.console import Console

from intellect_protocol.shared.cli import CaFileOption, TlsCertOption, TlsKeyOption, entry_point, tls_files, unlock
from intellect_protocol.shared.coordinator_client import ProtocolError
from intellect_protocol.shared.logs import configure
from intellect_protocol.shared.serving import server_config
from intellect_protocol.shared.shardcast.relay import RelayWorker
from intellect_protocol.shared.shardcast.server import create_server
from intellect_protocol.shared.shardcast.store import StepStore

err = Console(stderr=True)
app = typer.Typer(add_completion=False)


@app.command()
def main(
    coordinator: Annotated[str, typer.Option(help="Coordinator URL: the source of manifests and the relay directory.")],
    wallet_file: Annotated[
        Path,
        typer.Option("--wallet", help="Keystore of an address holding the relay role (password: INTELLECT_WALLET_PASSWORD)."),
    ],
    data_dir: Annotated[Path, typer.Option(help="Where steps live: DATA_DIR/RUN/STEP/.")],
    upstream: Annotated[
        list[str] | None, typer.Option(help="An origin or relay URL to fetch chunks from; repeat for several.")
    ] = None,
    origin: Annotated[
        bool, typer.Option("--origin", help="Serve the trainer's own steps from DATA_DIR instead of relaying.")
    ] = False,
    host: Annotated[str, typer.Option(help="Interface to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8100,
    public_url: Annotated[
        str | None, typer.Option(help="URL clients reach this server at; default http://HOST:PORT (https:// with --tls-cert).")
    ] = None,
    keep: Annotated[
        int,
        typer.Option(
            min=1,
            help="Newest steps of each run to keep: at least a run's async level + 1, so every step a task may still use stays downloadable.",
        ),
    ] = 3,
    grace_s: Annotated[float, typer.Option(min=0, help="Seconds an older step stays after it is retired.")] = 60.0,
    concurrency: Annotated[int, typer.Option(min=1, max=64, help="Chunks fetched from upstreams at once.")] = 4,
    tls_cert: TlsCertOption = None,
    tls_key: TlsKeyOption = None,
    ca_file: CaFileOption = None,
) -> None:
    """Serve policy steps: register with the coordinator, follow its manifests, fetch and verify
    chunks (relay) or serve the trainer's files in place (origin), and answer many clients at once."""
    if origin == bool(upstream):
        err.print("[red]Give --upstream (a relay) or --origin (the trainer's origin), not both or neither.[/red]")
        raise typer.Exit(2)
    tls = tls_files(tls_cert, tls_key, err)
    account = unlock(wallet_file, err)
    configure()
    store = StepStore(data_dir, keep=keep, grace_s=grace_s, complete_on_disk=origin)
    worker = RelayWorker(
        store,
        coordinator,
        account,
        public_url or f"{'https' if tls else 'http'}://{host}:{port}",
        upstreams=upstream or (),
        concurrency=concurrency,
    )
    server = uvicorn.Server(server_config(create_server(store), host, port, log_level="warning", access_log=False, tls=tls))
    try:
        asyncio.run(_serve(server, worker))
    except ProtocolError as e:
        err.print(f"The coordinator refused this {worker.kind}'s registration: {e}", style="red", markup=False)
        raise typer.Exit(1) from None


async def _serve(server: uvicorn.Server, worker: RelayWorker) -> None:
    """The server and the worker in one event loop; either ending (a signal, a refused
    registration) ends both."""
    serving = asyncio.create_task(server.serve())
    while not server.started and not serving.done():
        await asyncio.sleep(0.02)
    working = asyncio.create_task(worker.run())
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, lambda: setattr(server, "should_exit", True))
    done, _ = await asyncio.wait({serving, working}, return_when=asyncio.FIRST_COMPLETED)
    server.should_exit = True
    working.cancel()
    await asyncio.gather(serving, working, return_exceptions=True)
    for task in done:
        if not task.cancelled() and task.exception() is not None:
            raise task.exception()  # type: ignore[misc]


cli = entry_point(app)
"""The console script: ``app`` with TLS failures told in one sentence."""
