"""What an epoch anchors, computed the same way by the coordinator and by anyone auditing it.

An epoch covers the ledger entries up to ``last_entry_id`` that were final at ``cutoff``. Each
entry's credit micro-units become token base units (:data:`shared.money.TOKEN_BASE_PER_CREDIT`
each) and only integers are summed, so every replica and auditor builds the same root. An address
whose cumulative amount is not positive has no leaf.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from eth_utils import to_checksum_address
from pydantic import BaseModel

from intellect_protocol.shared.money import TOKEN_BASE_PER_CREDIT, TOKEN_DECIMALS
from intellect_protocol.shared.states import EntryKind


class LedgerEntry(BaseModel):
    """One public ledger entry, as ``GET /v1/public/ledger`` exports it."""

    id: int
    address: str
    submission_id: str
    kind: EntryKind
    units: int
    """Credit micro-units (:mod:`shared.money`)."""
    created_at: datetime
    final_at: datetime


class EpochInfo(BaseModel):
    """One anchoring epoch and, once confirmed, its transaction."""

    epoch: int
    root: str
    last_entry_id: int
    """Entries up to this id count ..."""
    cutoff: datetime
    """... if they were final at this time."""
    addresses: int
    total: str
    """Sum of every cumulative amount (token base units, decimal: too large for a JSON number)."""
    created_at: datetime
    tx_hash: str | None = None
    block: int | None = None
    anchored_at: datetime | None = None


class EpochProof(BaseModel):
    """What ``claim`` needs for one address: its cumulative amount and the siblings up to the root."""

    epoch: int
    address: str
    cumulative: str
    """Token base units, decimal."""
    proof: list[str]
    root: str


class ChainInfo(BaseModel):
    """Where this deployment settles (``enabled`` false: it does not)."""

    enabled: bool
    rpc_url: str | None = None
    """The RPC the coordinator uses; a node may use any other RPC of the same chain."""
    chain_id: int | None = None
    """None until the coordinator has reached the chain."""
    token: str | None = None
    stake_registry: str | None = None
    distributor: str | None = None
    sender: str | None = None
    """The coordinator's address on chain: it posts roots and slashes."""
    from_block: int = 0
    """The block the contracts were deployed at: their events (every root ever posted) start there."""
    token_decimals: int = TOKEN_DECIMALS
    """Decimals of the reward token: how many base units (every amount on the wire) make one token."""


class NodeSettlement(BaseModel):
    """One address on chain (token base units, decimal strings; None where the chain could not be read)."""

    address: str
    staked: str | None
    unbonding: str | None
    slashed: str
    """As the coordinator recorded its slashes."""
    earned: str
    """Cumulative final credit in the newest anchored epoch."""
    claimed: str | None
    claimable: str | None


class SettlementOverview(BaseModel):
    """What the leaderboard page shows of settlement: recent epochs and nodes' stakes and claims."""

    chain: ChainInfo
    chain_error: str | None = None
    epochs: list[EpochInfo] = []
    nodes: list[NodeSettlement] = []


def cumulative_amounts(entries: Iterable[tuple[int, str, int, datetime]], last_entry_id: int, cutoff: datetime) -> dict[str, int]:
    """``{checksum address: cumulative final amount}`` from ``(id, address, units, final_at)`` entries."""
    totals: dict[str, int] = {}
    for entry_id, address, units, final_at in entries:
        if entry_id <= last_entry_id and final_at <= cutoff:
            key = to_checksum_address(address)
            totals[key] = totals.get(key, 0) + units * TOKEN_BASE_PER_CREDIT
    return {address: amount for address, amount in totals.items() if amount > 0}
