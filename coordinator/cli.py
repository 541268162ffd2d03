"""``intellect-coordinator``: migrate the ledger, serve the API, manage admin tokens."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, ParamSpec, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker

from intellect_protocol.coordinator.db import (
    NotMigratedError,
    alembic_config,
    make_engine,
    make_sessionmaker,
    normalize_database_url,
    require_migrated,
)
from intellect_protocol.coordinator.db_errors import DatabaseError, check_url, explain
from intellect_protocol.coordinator.services import admin_tokens
from intellect_protocol.coordinator.settings import CoordinatorSettings
from intellect_protocol.shared.cli import TlsCertOption, TlsKeyOption, tls_files
from intellect_protocol.shared.island_schemas import OuterSettings
from intellect_protocol.shared.logs import configure
from intellect_protocol.shared.run_schemas import RUN_DEFAULTS, AuditPolicy

app = typer.Typer(help="Run and operate an Intellect Protocol coordinator.", no_args_is_help=True)
tokens = typer.Typer(help="Create, list and revoke admin bearer tokens.", no_args_is_help=True)
app.add_typer(tokens, name="admin-token")
console = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)

DatabaseUrl = Annotated[
    str | None,
    typer.Option(
        "--database-url", help="SQLAlchemy URL of the ledger; default: INTELLECT_DATABASE_URL or sqlite:///intellect.db."
    ),
]


def _settings(database_url: str | None, **overrides: object) -> CoordinatorSettings:
    values: dict[str, Any] = {k: v for k, v in overrides.items() if v is not None}
    if database_url is not None:
        values["database_url"] = database_url
    return CoordinatorSettings(**values)


P = ParamSpec("P")
R = TypeVar("R")


def _database_command(command: Callable[P, R]) -> Callable[P, R]:
    """A command that uses the ledger: a database it cannot use ends it with one sentence saying
    what to do (exit 2), never a traceback."""

    @functools.wraps(command)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return command(*args, **kwargs)
        except (DatabaseError, NotMigratedError) as e:
            err.print(escape(str(e)), style="red")
        except OperationalError as e:
            url = _settings(kwargs.get("database_url")).database_url  # type: ignore[arg-type]
            err.print(escape(str(explain(e, url))), style="red")
        raise typer.Exit(2)

    return wrapper


def _sessions(database_url: str | None) -> sessionmaker[Session]:
    url = _settings(database_url).database_url
    engine = make_engine(url)
    require_migrated(engine, url)
    return make_sessionmaker(engine)


@app.command()
@_database_command
def migrate(
    database_url: DatabaseUrl = None,
    revision: Annotated[str, typer.Option(help="Target revision; 'head' for the newest.")] = "head",
) -> None:
    """Bring the ledger's schema to the given revision (creates a SQLite file if needed)."""
    from alembic import command

    settings = _settings(database_url)
    check_url(normalize_database_url(settings.database_url))
    command.upgrade(alembic_config(settings.database_url), revision)
    console.print(f"Ledger at {settings.database_url} migrated to {revision}.")


@app.command()
@_database_command
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
    settings = _settings(database_url, heartbeat_interval_s=heartbeat_interval)
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
@_database_command
def token_create(
    name: Annotated[str, typer.Option(help="Who or what the token is for.")],
    scope: Annotated[str, typer.Option(help="read, operate or admin (each includes the previous).")] = "admin",
    database_url: DatabaseUrl = None,
) -> None:
    """Create a token and print it once; only its hash is stored."""
    if scope not in admin_tokens.SCOPES:
        err.print(f"--scope must be one of {', '.join(admin_tokens.SCOPES)}.", style="red", markup=False)
        raise typer.Exit(2)
    sessions = _sessions(database_url)
    with sessions.begin() as session:
        row, token = admin_tokens.create_token(session, name, scope, datetime.now(UTC))
    err.print(f"Token {row.id} '{name}' ({scope}). Store it now: it cannot be shown again.")
    print(token)


@tokens.command("list")
@_database_command
def token_list(database_url: DatabaseUrl = None) -> None:
    """List tokens (never their secrets)."""
    sessions = _sessions(database_url)
    table = Table("id", "name", "scope", "created", "revoked")
    with sessions() as session:
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
@_database_command
def token_revoke(
    token_id: Annotated[int, typer.Argument(help="The token's id, from `admin-token list`.")], database_url: DatabaseUrl = None
) -> None:
    """Revoke a token at once."""
    sessions = _sessions(database_url)
    with sessions.begin() as session:
        row = admin_tokens.revoke_token(session, token_id, datetime.now(UTC))
    if row is None:
        err.print(f"No token with id {token_id}.", style="red", markup=False)
        raise typer.Exit(1)
    console.print(f"Token {token_id} revoked.")


runs_app = typer.Typer(help="Create RL runs and list the environments they can name.", no_args_is_help=True)
app.add_typer(runs_app, name="run")


@runs_app.command("create")
@_database_command
def run_create(
    name: Annotated[str, typer.Option(help="A unique name for the run.")],
    environment: Annotated[
        str,
        typer.Option(help="An installed environment plugin (built in: arithmetic, math, code); the run pins its version."),
    ] = RUN_DEFAULTS.environment,
    model: Annotated[str, typer.Option(help="Model path or hub id; default: the shipped tiny model.")] = RUN_DEFAULTS.model,
    prompts_per_task: Annotated[int, typer.Option(help="Prompts in one task (1 to 1024).")] = RUN_DEFAULTS.prompts_per_task,
    samples_per_prompt: Annotated[
        int, typer.Option(help="Samples per prompt, the GRPO group size (1 to 256).")
    ] = RUN_DEFAULTS.samples_per_prompt,
    temperature: Annotated[float, typer.Option(help="Sampling temperature (0 to 10).")] = RUN_DEFAULTS.sampling.temperature,
    top_p: Annotated[float, typer.Option(help="Nucleus sampling mass (above 0, at most 1).")] = RUN_DEFAULTS.sampling.top_p,
    max_tokens: Annotated[int, typer.Option(help="Longest completion.")] = RUN_DEFAULTS.sampling.max_tokens,
    length_alpha: Annotated[
        float, typer.Option(help="Thinking-budget penalty per token off target; 0 disables it.")
    ] = RUN_DEFAULTS.length_budget.alpha,
    target_length: Annotated[
        int, typer.Option(help="Thinking-budget target length, in tokens.")
    ] = RUN_DEFAULTS.length_budget.target_tokens,
    length_over_only: Annotated[
        bool, typer.Option(help="Penalise only tokens past the target (a ceiling), not short answers too.")
    ] = RUN_DEFAULTS.length_budget.over_only,
    system_prompt: Annotated[
        str | None,
        typer.Option(help="A system turn before every problem (rendered by the model's chat template; without one, prepended)."),
    ] = None,
    thinking: Annotated[
        bool | None,
        typer.Option(
            "--thinking/--no-thinking",
            help="The chat template's enable_thinking switch (Qwen3-style templates); default: the template's own.",
        ),
    ] = None,
    calibration: Annotated[
        Path | None,
        typer.Option(
            help="Tolerances calibrated on the run's model (the JSON `intellect-validator calibrate --out` writes); the run "
            "then admits only the numerics calibrated. Default: the shipped model's bounds, any numerics.",
            exists=True,
            dir_okay=False,
        ),
    ] = None,
    async_level: Annotated[
        int, typer.Option(help="Accept rollouts of policies at most this many steps old (0: synchronous; at most 64).")
    ] = RUN_DEFAULTS.async_level,
    audit_share: Annotated[
        float,
        typer.Option(
            help="Share of accepted work a second validator checks before training (new nodes and suspect validators get more).",
        ),
    ] = AuditPolicy().share,
    dispute_window: Annotated[
        float | None,
        typer.Option(help="Seconds credit stays pending (clawback possible) before it is final; default: the coordinator's."),
    ] = None,
    min_stake: Annotated[
        str,
        typer.Option(
            help="Tokens (an exact decimal, e.g. 50 or 0.5) a node must have staked to lease this run's tasks (needs settlement on a chain); 0: none."
        ),
    ] = "0",
    sync_every: Annotated[
        int, typer.Option(help="Trainer islands: inner GRPO steps between outer steps (DiLoCo's H).")
    ] = OuterSettings().sync_every,
    outer_lr: Annotated[
        float | None,
        typer.Option(
            help="Trainer islands: the outer Nesterov SGD's learning rate; default 1.0 (plain averaging) below H = 50, 0.7 from there."
        ),
    ] = None,
    outer_momentum: Annotated[
        float | None,
        typer.Option(help="Trainer islands: the outer Nesterov SGD's momentum; default 0 below H = 50, 0.9 from there."),
    ] = None,
    min_islands: Annotated[
        int,
        typer.Option(
            help="Trainer islands: fewest islands whose pseudo-gradients an outer step judges (3 resists one lying island; 1 lets any step alone)."
        ),
    ] = OuterSettings().min_islands,
    database_url: DatabaseUrl = None,
) -> None:
    """Create an active run that nodes can lease tasks of."""
    from pydantic import ValidationError

    from intellect_protocol.coordinator.errors import ApiError
    from intellect_protocol.coordinator.services.runs import create_run
    from intellect_protocol.shared.environments.length import LengthBudget
    from intellect_protocol.shared.money import parse_tokens
    from intellect_protocol.shared.prompting import Prompting
    from intellect_protocol.shared.run_schemas import RunSpec
    from intellect_protocol.shared.schemas import SamplingParams

    try:
        spec = RunSpec(
            name=name,
            environment=environment,
            model=model,
            sampling=SamplingParams(temperature=temperature, top_p=top_p, max_tokens=max_tokens),
            prompts_per_task=prompts_per_task,
            samples_per_prompt=samples_per_prompt,
            length_budget=LengthBudget(alpha=length_alpha, target_tokens=target_length, over_only=length_over_only),
            prompting=Prompting(system_prompt=system_prompt, enable_thinking=thinking),
            tolerances=_calibrated(calibration) if calibration else None,
            async_level=async_level,
            dispute_window_s=dispute_window,
            audit=AuditPolicy(share=audit_share),
            min_stake=parse_tokens(min_stake, allow_zero=True),
            outer=OuterSettings(sync_every=sync_every, outer_lr=outer_lr, outer_momentum=outer_momentum, min_islands=min_islands),
        )
    except ValidationError as e:
        where = ".".join(map(str, e.errors()[0]["loc"]))
        err.print(f"Invalid run setting {where}: {e.errors()[0]['msg']}.", markup=False)
        raise typer.Exit(2) from None
    except CalibrationError as e:
        err.print(f"--calibration {calibration}: {e}.", markup=False)
        raise typer.Exit(2) from None
    except ValueError as e:
        err.print(f"--min-stake: {e}.", markup=False)
        raise typer.Exit(2) from None
    sessions = _sessions(database_url)
    try:
        with sessions.begin() as session:
            run = create_run(session, spec, datetime.now(UTC))
    except ApiError as e:
        err.print(f"{e.message}", style="red", markup=False)
        raise typer.Exit(2) from None
    if calibration is None and model != RUN_DEFAULTS.model:
        err.print(
            f"{run.id} is not calibrated on {model}: validators judge it by the shipped model's tolerances, a guess "
            "about any other model. Measure them with intellect-validator calibrate --model ... --out FILE and send the "
            "file's tolerances in PATCH /v1/admin/runs/ID before nodes join.",
            style="yellow",
            markup=False,
        )
    print(run.id)


class CalibrationError(ValueError):
    """A ``--calibration`` file without the tolerances ``intellect-validator calibrate --out`` writes."""


def _calibrated(path: Path) -> dict[str, object]:
    try:
        written = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CalibrationError(f"cannot be read as JSON ({e})") from None
    tolerances = written.get("tolerances") if isinstance(written, dict) else None
    if not isinstance(tolerances, dict):
        raise CalibrationError("has no tolerances (write one with intellect-validator calibrate --out FILE)")
    return tolerances


@runs_app.command("environments")
def run_environments() -> None:
    """List the environments a run can name here: the built-in ones and every installed plugin, with the version a new run pins."""
    from intellect_protocol.shared.environments.registry import EnvironmentUnavailable, installed

    try:
        plugins = installed()
    except EnvironmentUnavailable as e:
        err.print(f"{e}.", style="red", markup=False)
        raise typer.Exit(2) from None
    for name, found in sorted(plugins.items()):
        print(f"{name}\t{found.pin}")
