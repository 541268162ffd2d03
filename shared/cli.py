"""What the role commands share: the wallet option, unlocking it, stopping on SIGTERM, and TLS: the
CA a client trusts (``--ca-file``) and the certificate a server presents (``--tls-cert``/``--tls-key``)."""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer
from rich.console import Console

from intellect_protocol.shared.tls import CA_FILE_ENV, TlsError, Untrusted, server_tls, trust

if TYPE_CHECKING:
    from eth_account.signers.local import LocalAccount

EXIT_TLS = 6
"""Exit code of a role or node command that stopped because TLS failed (a certificate not trusted)."""

WalletOption = Annotated[
    Path, typer.Option("--wallet", help="Keystore; its password from INTELLECT_WALLET_PASSWORD or a prompt.")
]


def unlock(wallet_file: Path, err: Console) -> LocalAccount:
    """The wallet's account, or a one-line error and exit code 1."""
    from intellect_protocol.shared.wallet import WalletError, load_wallet, read_password  # eth_account: 0.4 s

    try:
        return load_wallet(wallet_file, read_password())
    except WalletError as e:
        err.print(f"{e}", style="red", markup=False)
        raise typer.Exit(1) from None


def exit_now() -> NoReturn:
    """Exit 0 at once, once the exit handlers (the CPU ledger's last write) have run. The interpreter's own
    teardown of vLLM and torch (and the join of any thread still waiting on the coordinator) takes 2 s on an
    idle machine and several times that on a busy one, past a devnet's stop deadline: a validator that had said
    it stopped was killed there."""
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def stop_on_sigterm() -> threading.Event:
    """An event set by SIGTERM, so a role's loop can finish its current work and exit cleanly."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    return stop


def stop_as_ctrl_c() -> threading.Event:
    """SIGTERM and Ctrl-C both stop a role at once: a KeyboardInterrupt wherever its main thread is (a long poll
    for work, a check in progress), for a role whose work in hand lapses back to the coordinator's queue when it
    stops (a validator's claims). The event returned is set as well, for the waits on other threads, and also
    when the kernel hands the signal to another thread (:func:`on_any_thread`). Once: a second signal is ignored
    while the role stops."""
    stop = threading.Event()

    def interrupt(*_: object) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_IGN)
        stop.set()
        raise KeyboardInterrupt

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, interrupt)
    on_any_thread(stop.set)
    return stop


def on_any_thread(begin_stop: Callable[[], None]) -> None:
    """Also run ``begin_stop`` from a thread of its own when SIGTERM or SIGINT arrives. Python runs a
    signal's handler on the main thread only, once that thread runs again: when the kernel hands the
    signal to another thread, a main thread asleep in a wait the signal did not interrupt runs no
    handler until the wait ends (a devnet node in CI outlived its stop deadline without its handler
    having run: this is the cause that fits). Every handled signal's number is written to the wakeup
    fd, whichever thread took it."""
    reader, writer = os.pipe()
    os.set_blocking(writer, False)
    signal.set_wakeup_fd(writer, warn_on_full_buffer=False)

    def watch() -> None:
        while received := os.read(reader, 64):
            if {signal.SIGTERM, signal.SIGINT} & set(received):
                begin_stop()
                return

    threading.Thread(target=watch, name="signals", daemon=True).start()


def _trusting(ca_file: Path | None) -> Path | None:
    if ca_file is not None:
        try:
            trust(ca_file)
        except TlsError as e:
            raise typer.BadParameter(str(e)) from None
    return ca_file


CaFileOption = Annotated[
    Path | None,
    typer.Option(
        "--ca-file",
        envvar=CA_FILE_ENV,
        callback=_trusting,
        help="PEM certificate of a private certificate authority to trust beside the public ones, "
        "for a coordinator or relay whose HTTPS certificate it signed.",
    ),
]
"""Trust is process-wide (:func:`shared.tls.trust`): the option takes effect as it is parsed."""

TlsCertOption = Annotated[
    Path | None,
    typer.Option(
        "--tls-cert", envvar="INTELLECT_TLS_CERT", help="Serve HTTPS with this certificate chain (PEM); needs --tls-key."
    ),
]
TlsKeyOption = Annotated[
    Path | None, typer.Option("--tls-key", envvar="INTELLECT_TLS_KEY", help="The private key (PEM) of --tls-cert.")
]


def tls_files(cert: Path | None, key: Path | None, err: Console) -> dict[str, str]:
    """uvicorn's options to serve HTTPS with ``cert`` and ``key`` (none for plain HTTP), checked
    now so a bad pair is one sentence and exit code 2, not a traceback once the server starts."""
    try:
        return server_tls(cert, key)
    except TlsError as e:
        err.print(f"{e}", style="red", markup=False)
        raise typer.Exit(2) from None


def entry_point(app: typer.Typer) -> Callable[[], None]:
    """The console script of a role's ``app``: a TLS failure (:class:`Untrusted`), wherever a client
    met it, ends the command with its one sentence and :data:`EXIT_TLS`, not a traceback."""

    def run() -> None:
        try:
            app()
        except Untrusted as e:
            Console(stderr=True, soft_wrap=True).print(f"{e}", style="red", markup=False)
            sys.exit(EXIT_TLS)

    return run
