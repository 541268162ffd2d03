"""``intellect-node stake | unstake | claim | verify-epoch``: settlement on the deployment's chain.

Exit codes: 0 done (or nothing to do, said so), 1 wallet problem or bad amount, 2 coordinator or
chain unreachable, or no settlement there, 5 the chain refused (no gas, no stake, a revert: the
reason is printed), 6 ``verify-epoch`` found a root the ledger does not support.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import Progress

from intellect_protocol.node.cli_output import CoordinatorUrl, checked_url, console, fail
from intellect_protocol.shared.cli import CaFileOption
from intellect_protocol.shared.money import credit, parse_tokens, tokens
from intellect_protocol.shared.schemas import NodeStatus
from intellect_protocol.shared.settlement import EpochInfo
from intellect_protocol.shared.wallet import WalletError, load_wallet, read_password

Wallet = Annotated[
    Path, typer.Option("--wallet", help="Keystore that pays the gas; its password from INTELLECT_WALLET_PASSWORD or a prompt.")
]
Rpc = Annotated[
    str | None, typer.Option(help="EVM JSON-RPC URL to use instead of the one the coordinator advertises.", callback=checked_url)
]


@contextmanager
def _settlement(doing: str, coordinator: str, rpc: str | None, wallet_file: Path | None = None) -> Iterator[tuple[Any, Any, Any]]:
    """(api, settlement, account) for the command ``doing`` ("stake", "claim", ...); every failure
    becomes a message, naming what could not be done, and an exit code."""
    from intellect_protocol.node.settlement import SettlementUnavailable, settlement_of
    from intellect_protocol.shared.chain import ChainError
    from intellect_protocol.shared.coordinator_client import CoordinatorClient, ProtocolError

    account = None
    if wallet_file is not None:
        try:
            account = load_wallet(wallet_file, read_password())
        except WalletError as e:
            raise fail(str(e), 1) from None
    try:
        with CoordinatorClient(coordinator, give_up_s=30.0) as api:
            yield api, settlement_of(api, rpc), account
    except (ProtocolError, SettlementUnavailable) as e:
        raise fail(f"Cannot {doing} through {coordinator}: {e}", 2) from None
    except ChainError as e:
        raise fail(f"The chain refused: {e}", 5) from None


def _amount(text: str) -> int:
    try:
        return parse_tokens(text)
    except ValueError as e:
        raise fail(str(e), 1) from None


def stake(
    amount: Annotated[str, typer.Argument(help="Tokens to stake, e.g. 100 or 0.5.")],
    wallet_file: Wallet,
    coordinator: CoordinatorUrl = "http://127.0.0.1:8000",
    ca_file: CaFileOption = None,
    rpc: Rpc = None,
) -> None:
    """Stake tokens in the deployment's stake registry (runs may require a stake to lease work)."""
    value = _amount(amount)
    with _settlement("stake", coordinator, rpc, wallet_file) as (_, chain, account):
        held = chain.token.functions.balanceOf(account.address).call()
        if held < value:
            raise fail(
                f"{account.address} holds {tokens(held)} tokens, less than {amount}. Tokens are minted by whoever deployed "
                f"the deployment's token ({chain.token.address}): ask the coordinator's operator. On `intellect-devnet "
                "--chain` every node and validator the devnet makes is funded and staked already.",
                5,
            )
        with console.status("Approving the stake registry…"):
            if chain.token.functions.allowance(account.address, chain.registry.address).call() < value:
                chain.transact(account, chain.token.functions.approve(chain.registry.address, value))
        with console.status(f"Staking {amount}…"):
            receipt = chain.transact(account, chain.registry.functions.stake(value))
        console.print(
            f"Staked {amount}: {account.address} now stakes {tokens(chain.stake_of(account.address))} (tx {receipt['transactionHash'].to_0x_hex()})."
        )


def unstake(
    wallet_file: Wallet,
    amount: Annotated[str | None, typer.Argument(help="Tokens to start unbonding; omit with --withdraw.")] = None,
    withdraw: Annotated[bool, typer.Option("--withdraw", help="Withdraw what finished unbonding instead.")] = False,
    coordinator: CoordinatorUrl = "http://127.0.0.1:8000",
    ca_file: CaFileOption = None,
    rpc: Rpc = None,
) -> None:
    """Start unbonding stake (it can still be slashed until the delay ends), or --withdraw it after."""
    import datetime as dt

    if (amount is None) == (not withdraw):
        raise fail("Give an amount to unstake, or --withdraw (not both).", 1)
    value = None if withdraw else _amount(amount or "")
    with _settlement("unstake", coordinator, rpc, wallet_file) as (_, chain, account):
        registry = chain.registry.functions
        if value is None:
            waiting = registry.unbonding(account.address).call()
            if waiting == 0:
                raise fail(
                    f"Nothing to withdraw: {account.address} has no stake unbonding (start with `intellect-node unstake AMOUNT`).",
                    5,
                )
            with console.status(f"Withdrawing {tokens(waiting)}…"):
                chain.transact(account, registry.withdraw())
            console.print(f"Withdrew {tokens(waiting)} to {account.address}.")
            return
        staked = chain.stake_of(account.address)
        if staked < value:
            raise fail(f"{account.address} stakes {tokens(staked)}, less than {amount}.", 5)
        with console.status(f"Unstaking {amount}…"):
            chain.transact(account, registry.request_unstake(value))
        until = dt.datetime.fromtimestamp(registry.withdrawable_at(account.address).call(), dt.UTC)
        console.print(
            f"{tokens(registry.unbonding(account.address).call())} unbonding; withdraw with --withdraw after {until:%Y-%m-%d %H:%M} UTC."
        )


def _why_nothing(api: Any, address: str, epoch: int) -> str:
    """Why ``address`` has nothing in anchored ``epoch``, and whether waiting would change that."""
    from intellect_protocol.shared.coordinator_client import Refused

    try:
        banned = api.node(address).status == NodeStatus.banned
    except Refused as e:
        if e.status != 404:
            raise
        banned = False  # credit without a node of that address: laid by an operator, or a node since removed
    if banned:
        return (
            f", now or later: {address} is banned, and the credit it had not made final was clawed back. "
            "`intellect-node receipts` shows the rejected work."
        )
    held = api.credit(address)
    if held.final:
        return f" yet: {credit(held.final)} final credit came after epoch {epoch} closed; the next anchored epoch holds it."
    if held.pending:
        return (
            f" yet: {credit(held.pending)} credit is pending; it turns final after the dispute window, then an epoch anchors it."
        )
    return f": {address} has no credit left in this coordinator's ledger, after clawbacks."


CLAIM_ATTEMPTS = 3
"""Epochs a claim follows: the contract pays only against the newest root, and one may land while a claim is
being built and sent (the devnet anchors every few seconds)."""


def claim(
    wallet_file: Wallet, coordinator: CoordinatorUrl = "http://127.0.0.1:8000", ca_file: CaFileOption = None, rpc: Rpc = None
) -> None:
    """Claim the reward tokens for this wallet's final credit, as of the newest root on chain."""

    from intellect_protocol.shared.chain import ChainError

    with _settlement("claim", coordinator, rpc, wallet_file) as (api, chain, account):
        for attempt in range(1, CLAIM_ATTEMPTS + 1):
            epoch = chain.latest_epoch()
            try:
                _claim_at(api, chain, account, epoch)
                return
            except ChainError:
                if attempt == CLAIM_ATTEMPTS or chain.latest_epoch() == epoch:
                    raise
                console.print(f"A newer root landed on chain while claiming against epoch {epoch}; claiming again.")


def _claim_at(api: Any, chain: Any, account: Any, epoch: int) -> None:
    """Claim against the root of ``epoch``, the newest on chain when read (a ChainError if it no longer is)."""
    from intellect_protocol.shared.coordinator_client import Refused
    from intellect_protocol.shared.merkle import root_of

    if epoch == 0:
        console.print("Nothing to claim: no epoch has been anchored on chain yet.")
        return
    try:
        found = api.epoch_proof(epoch, account.address)
    except Refused as e:
        if e.status != 404:
            raise
        console.print(f"Nothing to claim{_why_nothing(api, account.address, epoch)}")
        return
    cumulative, proof = int(found.cumulative), [bytes.fromhex(p.removeprefix("0x")) for p in found.proof]
    if root_of(account.address, cumulative, proof) != chain.root_at(epoch):
        raise fail(
            f"The coordinator's proof for epoch {epoch} does not reach the root on chain; run `intellect-node verify-epoch {epoch}`.",
            6,
        )
    already = chain.claimed(account.address)
    if cumulative <= already:
        console.print(f"Nothing to claim: {tokens(already)} claimed already, {tokens(cumulative)} earned up to epoch {epoch}.")
        return
    with console.status(f"Claiming {tokens(cumulative - already)} (epoch {epoch})…"):
        receipt = chain.transact(account, chain.distributor.functions.claim(account.address, cumulative, proof))
    console.print(f"Claimed {tokens(cumulative - already)} for {account.address} (tx {receipt['transactionHash'].to_0x_hex()}).")


def verify_epoch(
    epoch: Annotated[int | None, typer.Argument(help="The epoch to check; every epoch if omitted.", min=1)] = None,
    coordinator: CoordinatorUrl = "http://127.0.0.1:8000",
    ca_file: CaFileOption = None,
    rpc: Rpc = None,
) -> None:
    """Audit settlement: every root the distributor ever accepted (its events, not the coordinator's
    list) must be one the coordinator lists with its transaction, rebuilt from the public ledger,
    with a cutoff no later than the block that posted it (else credit still open to dispute would
    be paid). Exits 6, one sentence per finding, on anything else."""
    from intellect_protocol.node.settlement import audit_epochs, rebuild_roots

    with _settlement("verify epochs", coordinator, rpc) as (api, chain, _):
        # The chain as of one block, read before the coordinator's list: an epoch the coordinator lists and posts
        # while this runs is then one still waiting, never one the chain "moved past" without it.
        head = chain.w3.eth.block_number
        posted = chain.posted_roots(api.chain_info().from_block, head)
        latest = chain.latest_epoch(head)
        listed = {e.epoch: e for e in api.epochs(limit=500)}
        wanted = sorted({*posted, *listed} if epoch is None else {epoch})
        for n in wanted:
            if n not in listed:
                found = _listed(api, n)
                if found is not None:
                    listed[n] = found
        if not wanted or not any(n in posted or n in listed for n in wanted):
            console.print(
                "No epoch anchored yet: nothing to verify." if epoch is None else f"Epoch {epoch} is neither on chain nor listed."
            )
            if epoch is None:
                return
            raise typer.Exit(6)
        buildable = [listed[n] for n in wanted if n in listed]
        with Progress(console=console, transient=True) as bar:
            task = bar.add_task("Reading the public ledger", total=max([e.last_entry_id for e in buildable], default=0))
            rebuilt = rebuild_roots(api, buildable, lambda done: bar.update(task, completed=done)) if buildable else {}
        findings = audit_epochs(wanted, posted, {n: listed[n] for n in wanted if n in listed}, rebuilt, latest)
        for n, problem in findings:
            if problem is None:
                console.print(
                    f"[green]✓[/green] epoch {n}: {listed[n].root} ({listed[n].addresses} addresses) matches the chain and the ledger."
                )
            elif problem.startswith("waiting"):
                console.print(f"[yellow]…[/yellow] epoch {n}: {problem}")
            else:
                console.print(f"✗ epoch {n}: {problem}", style="red", markup=False)
        if any(p is not None and not p.startswith("waiting") for _, p in findings):
            raise typer.Exit(6)


def _listed(api: Any, n: int) -> EpochInfo | None:
    from intellect_protocol.shared.coordinator_client import Refused

    try:
        epoch: EpochInfo = api.epoch(n)
        return epoch
    except Refused as e:
        if e.status == 404:
            return None
        raise


def register(app: typer.Typer) -> None:
    app.command()(stake)
    app.command()(unstake)
    app.command()(claim)
    app.command("verify-epoch")(verify_epoch)
