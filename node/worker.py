"""``intellect-node join``: register (or resume), then heartbeat until told to stop."""

from __future__ import annotations

import threading
import time
from datetime import UTC
from pathlib import Path

from eth_account.signers.local import LocalAccount
from packaging.version import Version
from rich.console import Console

from node.client import (
    EXIT_BANNED,
    CoordinatorClient,
    NodeError,
    NotRegistered,
    Stopped,
    clock_skew_error,
    version_error,
)
from node.hardware import probe
from node.settings import NodeSettings
from node.state import NodeSession, load_session, save_session
from shared.version import __version__


def join(
    account: LocalAccount,
    coordinator: str,
    settings: NodeSettings,
    console: Console,
    *,
    operator_address: str | None = None,
    stop: threading.Event,
) -> None:
    """Run until ``stop`` is set; raises :class:`NodeError` for what retrying cannot fix."""
    client = CoordinatorClient(
        coordinator, account, settings, on_retry=lambda m: console.print(f"[yellow]{m}[/yellow]"), stop=stop
    )
    state_dir = settings.state_dir / account.address.lower()
    try:
        status = client.public_status()
        if Version(__version__) < Version(status.min_node_version):
            raise version_error(status.min_node_version)
        skew = time.time() - status.server_time
        if abs(skew) > status.signature_window_s:
            raise clock_skew_error(skew, status.signature_window_s)

        session = load_session(state_dir)
        if session and (session.coordinator, session.audience, session.address) == (
            client.base_url,
            status.audience,
            account.address,
        ):
            console.print(f"Resuming as {account.address} on {client.base_url} (registered {session.registered_at}).")
        else:
            session = _register(client, status.audience, state_dir, console, operator_address)

        interval = status.heartbeat_interval_s
        while not stop.is_set():
            try:
                beat = client.heartbeat("idle", {})
            except NotRegistered:
                console.print("[yellow]The coordinator no longer knows this node; registering again.[/yellow]")
                session = _register(client, status.audience, state_dir, console, operator_address)
                continue
            if beat.action == "stop":
                raise NodeError(
                    f"The coordinator's operator banned this node ({beat.reason}). Contact them to appeal.", EXIT_BANNED
                )
            if beat.status != session.last_status:
                console.print(f"Status: [bold]{beat.status}[/bold]")
            session.last_status = beat.status
            session.last_heartbeat_at = time.time()
            save_session(state_dir, session)
            interval = beat.heartbeat_interval_s
            stop.wait(interval)
    except Stopped:
        pass
    finally:
        client.close()


def _register(
    client: CoordinatorClient, audience: str, state_dir: Path, console: Console, operator_address: str | None
) -> NodeSession:
    specs = probe(state_dir)
    reply = client.register(specs, operator_address)
    session = NodeSession(
        coordinator=client.base_url,
        audience=audience,
        address=reply.address,
        registered_at=reply.first_seen.astimezone(UTC).isoformat(),
        last_status=reply.status,
    )
    save_session(state_dir, session)
    gpus = ", ".join(g.name for g in specs.gpus) or "no GPU"
    console.print(
        f"Registered {reply.address} with {client.base_url}: {specs.cpu_cores} cores, "
        f"{specs.ram_bytes / 2**30:.1f} GiB RAM, {gpus}. Heartbeating every {reply.heartbeat_interval_s:g} s; Ctrl-C to stop."
    )
    return session
