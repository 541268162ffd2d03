"""What the role commands (validator, trainer, relay) share: the wallet option, unlocking it, stopping on SIGTERM."""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from typing import Annotated

import typer
from eth_account.signers.local import LocalAccount
from rich.console import Console

from intellect_protocol.shared.wallet import WalletError, load_wallet, read_password

WalletOption = Annotated[
    Path, typer.Option("--wallet", help="Keystore; its password from INTELLECT_WALLET_PASSWORD or a prompt.")
]


def unlock(wallet_file: Path, err: Console) -> LocalAccount:
    """The wallet's account, or a one-line error and exit code 1."""
    try:
        return load_wallet(wallet_file, read_password())
    except WalletError as e:
        err.print(f"{e}", style="red", markup=False)
        raise typer.Exit(1) from None


def stop_on_sigterm() -> threading.Event:
    """An event set by SIGTERM, so a role's loop can finish its current work and exit cleanly."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    return stop
