"""``intellect-validator``: check every rollout before it earns credit or reaches the trainer."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from intellect_protocol.shared.cli import CaFileOption, WalletOption, entry_point, stop_on_sigterm, unlock
from intellect_protocol.shared.coordinator_client import Refused, Stopped
from intellect_protocol.shared.environments.registry import EnvironmentUnavailable

app = typer.Typer(help="Run an Intellect Protocol validator (the address needs the validator role).", no_args_is_help=True)
console = Console()
err = Console(stderr=True)


@app.callback()
def main() -> None:
    """Run an Intellect Protocol validator (the address needs the validator role)."""


@app.command()
def run(
    wallet_file: WalletOption,
    coordinator: Annotated[str, typer.Option(help="Coordinator URL.")] = "http://127.0.0.1:8000",
    ca_file: CaFileOption = None,
    state_dir: Annotated[Path, typer.Option(help="Where policy weights are kept.")] = Path.home() / ".intellect" / "validator",
    batch: Annotated[int, typer.Option(min=1, max=64, help="Submissions claimed at once.")] = 8,
) -> None:
    """Claim pending submissions, run every check on each, and post the verdicts, until Ctrl-C."""
    from intellect_protocol.validator.worker import Validator  # torch loads only for the command that needs it

    account = unlock(wallet_file, err)
    stop = stop_on_sigterm()
    try:
        validator = Validator(coordinator, account, state_dir / account.address.lower(), console, batch=batch, stop=stop)
    except (Stopped, KeyboardInterrupt):
        raise typer.Exit(0) from None
    console.print(f"Validating as {account.address} for {coordinator}; Ctrl-C to stop.")
    try:
        validator.run()
    except KeyboardInterrupt:
        pass
    except Refused as e:
        err.print(f"The coordinator refused this validator: {e}", style="red", markup=False)
        raise typer.Exit(5) from None
    except EnvironmentUnavailable as e:
        # Judging with other reward code than the node's would reject honest work: leave the claim to expire.
        err.print(f"This validator cannot judge a run's work: {e}.", style="red", markup=False)
        raise typer.Exit(7) from None
    finally:
        validator.close()
    console.print(f"Stopped after {validator.checked} submissions.")


cli = entry_point(app)
"""The console script: ``app`` with TLS failures told in one sentence."""
