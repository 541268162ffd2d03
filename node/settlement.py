"""Settlement from a node's side: reach the deployment's contracts, rebuild epochs from the public ledger.

``rebuild_roots`` is the audit anyone can run: it reads the coordinator's public ledger export,
applies the epoch's rule (:mod:`shared.settlement`) and builds the tree itself, so a root the
coordinator posted that the ledger does not support is caught without trusting the coordinator.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from intellect_protocol.shared.coordinator_client import CoordinatorClient
from intellect_protocol.shared.merkle import CreditTree
from intellect_protocol.shared.settlement import EpochInfo, LedgerEntry, cumulative_amounts

if TYPE_CHECKING:
    from intellect_protocol.shared.chain import PostedRoot, Settlement


class SettlementUnavailable(Exception):
    """This deployment does not settle on a chain, or its chain cannot be reached."""


def settlement_of(api: CoordinatorClient, rpc_url: str | None) -> Settlement:
    """The deployment's contracts, through ``rpc_url`` or else the RPC the coordinator advertises."""
    from intellect_protocol.shared.chain import ChainError, Settlement, connect

    info = api.chain_info()
    if not info.enabled or not (info.token and info.stake_registry and info.distributor):
        raise SettlementUnavailable(
            "this coordinator does not settle on a chain (it runs without --chain / INTELLECT_CHAIN_RPC_URL)"
        )
    url = rpc_url or info.rpc_url
    if url is None:
        raise SettlementUnavailable("the coordinator advertises no RPC URL: pass --rpc")
    try:
        w3 = connect(url)
    except ChainError as e:
        raise SettlementUnavailable(str(e)) from e
    if info.chain_id is not None and w3.eth.chain_id != info.chain_id:
        raise SettlementUnavailable(f"{url} serves chain {w3.eth.chain_id}, the coordinator settles on chain {info.chain_id}")
    return Settlement.at(w3, info.token, info.stake_registry, info.distributor)


def rebuild_roots(
    api: CoordinatorClient, epochs: list[EpochInfo], progress: Callable[[int], None] = lambda _: None
) -> dict[int, bytes | None]:
    """Each epoch's root rebuilt from the public ledger (None: the ledger gives it no credit at all).
    Reads the ledger once, up to the newest epoch's last entry; ``progress`` gets the last id read."""
    last = max(e.last_entry_id for e in epochs)
    entries: list[LedgerEntry] = []
    after = 0
    while after < last:
        page = api.ledger_page(after, limit=5000)
        if not page:
            break
        entries += page
        after = page[-1].id
        progress(min(after, last))
    rows = [(e.id, e.address, e.units, e.final_at) for e in entries]
    roots: dict[int, bytes | None] = {}
    for epoch in epochs:
        amounts = cumulative_amounts(rows, epoch.last_entry_id, epoch.cutoff)
        roots[epoch.epoch] = CreditTree(amounts).root if amounts else None
    return roots


def audit_epochs(
    epochs: list[int],
    posted: dict[int, PostedRoot],
    listed: dict[int, EpochInfo],
    rebuilt: dict[int, bytes | None],
    chain_latest: int,
) -> list[tuple[int, str | None]]:
    """Each of ``epochs`` with what is wrong with it (None: nothing; "waiting ...": listed, not yet
    posted, and still postable). ``posted``: the chain's roots by epoch; ``listed``: the coordinator's;
    ``rebuilt``: the roots the public ledger gives for the listed ones."""
    out: list[tuple[int, str | None]] = []
    for n in epochs:
        chain, ours = posted.get(n), listed.get(n)
        if ours is None:
            out.append((n, "the chain holds a root the coordinator does not list: nobody can rebuild it from the ledger"))
            continue
        if chain is None:
            late = n <= chain_latest  # epochs only increase on chain: this one can never be posted now
            out.append(
                (n, "listed without its transaction, and the chain has moved past it" if late else "waiting to be anchored")
            )
            continue
        mine = rebuilt.get(n)
        problems = []
        if ours.tx_hash != chain.tx_hash:
            problems.append(f"the coordinator lists transaction {ours.tx_hash or 'none'}, the root came in {chain.tx_hash}")
        if chain.cutoff > chain.block_time:
            problems.append(
                f"its cutoff {chain.cutoff} lies after the block that posted it ({chain.block_time}): credit still open to dispute was paid"
            )
        if int(ours.cutoff.timestamp()) != chain.cutoff:
            problems.append(f"the coordinator's cutoff {int(ours.cutoff.timestamp())} is not the chain's {chain.cutoff}")
        if mine is None or mine != chain.root or ours.root != "0x" + chain.root.hex():
            shown = "0x" + mine.hex() if mine else "none"
            problems.append(f"the ledger gives {shown}, the chain holds 0x{chain.root.hex()}, the coordinator says {ours.root}")
        out.append((n, "; ".join(problems) or None))
    return out
