"""What every ``intellect-node`` command shares: its consoles, failing with a message and an exit
code, and the coordinator URL option (checked before anything is sent)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console

from intellect_protocol.shared.urls import url_problem

console = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)


def fail(message: str, code: int) -> typer.Exit:
    err.print(f"{message}", style="red", markup=False)
    return typer.Exit(code)


def checked_url(url: str | None) -> str | None:
    """A URL that can never reach a coordinator is a usage error at once (exit 2), not endless retries."""
    problem = url_problem(url) if url is not None else None
    if problem is not None:
        raise typer.BadParameter(problem)
    return url


CoordinatorUrl = Annotated[str, typer.Option(help="Coordinator URL, e.g. http://127.0.0.1:8000.", callback=checked_url)]
