"""``intellect-coordinator``: migrate the ledger, serve the API, manage admin tokens."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from intellect_protocol.coordinator.cli_support import DatabaseUrl, console, database_command, err, sessions, settings_for
from intellect_protocol.coordinator.db import alembic_config, normalize_database_url
from intellect_protocol.coordinator.db_errors import check_url
from intellect_protocol.coordinator.run_commands import runs_app
from intellect_protocol.coordinator.services import admin_tokens
from intellect_protocol.shared.cli import TlsCertOption, TlsKeyOption, tls_files
from intellect_protocol.shared.logs import configure

app = typer.Typer(help="Run and operate an Intellect Protocol coordinator.", no_args_is_help=True)
tokens = typer.Typer(help="Create, list and revoke admin bearer tokens.", no_args_is_help=True)
app.add_typer(tokens, name="admin-token")


@app.command()
@database_command
def migrate(
    database_url: DatabaseUrl = None,
    revision: Annotated[str, typer.Option(help="Target revision; 'head' for the newest.")] = "head",
) -> None:
    """Bring the ledger's schema to the given revision (creates a SQLite file if needed)."""
    from alembic import command

    settings = settings_for(database_url)
    check_url(normalize_database_url(settings.database_url))
    command.upgrade(alembic_config(settings.database_url), revision)
    console.print(f"Ledger at {settings.database_url} migrated to {revision}.")


@app.command()
@database_command
def serve(
    host: Annotated[str, typer.Option(help="Interface to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port to listen on.")] = 8000,
    database_url: DatabaseUrl = None,
    heartbeat_interval: Annotated[
        float | None, typer.Option("--heartbeat-interval", help="Seconds between node heartbeats.")
    ] = None,
    log_level: Annotated[str, typer.Option(help="Log level: debug, info, warning, error.")] = "info",
    tls_cert: TlsCertOption = None,
    tls_key: TlsKeyOption = None,
) -> None:
    """Serve the coordinator's HTTP API (HTTPS with --tls-cert and --tls-key)."""
    import uvicorn

    from intellect_protocol.coordinator.app import create_app
    from intellect_protocol.shared.serving import listen, server_config

    configure(log_level)
    tls = tls_files(tls_cert, tls_key, err)
    settings = settings_for(database_url, heartbeat_interval_s=heartbeat_interval)
    try:
        sock = listen(host, port)
    except OSError as e:
        err.print(escape(str(e.strerror)), style="red")
        raise typer.Exit(2) from None
    api = create_app(settings)
    server = uvicorn.Server(
        server_config(api, host, port, settings.limits.header_limits, log_level=log_level, access_log=False, tls=tls)
    )
    server.run(sockets=[sock])


@tokens.command("create")
@database_command
def token_create(
    name: Annotated[str, typer.Option(help="Who or what the token is for.")],
    scope: Annotated[str, typer.Option(help="read, operate or admin (each includes the previous).")] = "admin",
    database_url: DatabaseUrl = None,
) -> None:
    """Create a token and print it once; only its hash is stored."""
    if scope not in admin_tokens.SCOPES:
        err.print(f"--scope must be one of {', '.join(admin_tokens.SCOPES)}.", style="red", markup=False)
        raise typer.Exit(2)
    ledger = sessions(database_url)
    with ledger.begin() as session:
        row, token = admin_tokens.create_token(session, name, scope, datetime.now(UTC))
    err.print(f"Token {row.id} '{name}' ({scope}). Store it now: it cannot be shown again.")
    print(token)


@tokens.command("list")
@database_command
def token_list(database_url: DatabaseUrl = None) -> None:
    """List tokens (never their secrets)."""
    ledger = sessions(database_url)
    table = Table("id", "name", "scope", "created", "revoked")
    with ledger() as session:
        for row in admin_tokens.list_tokens(session):
            table.add_row(
                str(row.id),
                row.name,
                row.scopes,
                f"{row.created_at:%Y-%m-%d %H:%M}",
                f"{row.revoked_at:%Y-%m-%d %H:%M}" if row.revoked_at else "",
            )
    console.print(table)


@tokens.command("revoke")
@database_command
def token_revoke(
    token_id: Annotated[int, typer.Argument(help="The token's id, from `admin-token list`.")], database_url: DatabaseUrl = None
) -> None:
    """Revoke a token at once."""
    ledger = sessions(database_url)
    with ledger.begin() as session:
        row = admin_tokens.revoke_token(session, token_id, datetime.now(UTC))
    if row is None:
        err.print(f"No token with id {token_id}.", style="red", markup=False)
        raise typer.Exit(1)
    console.print(f"Token {token_id} revoked.")


app.add_typer(runs_app, name="run")
