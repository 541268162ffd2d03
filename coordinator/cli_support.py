"""What the ``intellect-coordinator`` commands share: the consoles, the ledger's ``--database-url`` and the
ledger's sessions, and turning a database that cannot be used into one sentence."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Annotated, Any, ParamSpec, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker

from intellect_protocol.coordinator.db import NotMigratedError, make_engine, make_sessionmaker, require_migrated
from intellect_protocol.coordinator.db_errors import DatabaseError, explain
from intellect_protocol.coordinator.settings import CoordinatorSettings

console = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)

DatabaseUrl = Annotated[
    str | None,
    typer.Option(
        "--database-url", help="SQLAlchemy URL of the ledger; default: INTELLECT_DATABASE_URL or sqlite:///intellect.db."
    ),
]


def settings_for(database_url: str | None, **overrides: object) -> CoordinatorSettings:
    values: dict[str, Any] = {k: v for k, v in overrides.items() if v is not None}
    if database_url is not None:
        values["database_url"] = database_url
    return CoordinatorSettings(**values)


P = ParamSpec("P")
R = TypeVar("R")


def database_command(command: Callable[P, R]) -> Callable[P, R]:
    """A command that uses the ledger: a database it cannot use ends it with one sentence saying
    what to do (exit 2), never a traceback."""

    @functools.wraps(command)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return command(*args, **kwargs)
        except (DatabaseError, NotMigratedError) as e:
            err.print(escape(str(e)), style="red")
        except OperationalError as e:
            url = settings_for(kwargs.get("database_url")).database_url  # type: ignore[arg-type]
            err.print(escape(str(explain(e, url))), style="red")
        raise typer.Exit(2)

    return wrapper


def sessions(database_url: str | None) -> sessionmaker[Session]:
    url = settings_for(database_url).database_url
    engine = make_engine(url)
    require_migrated(engine, url)
    return make_sessionmaker(engine)
