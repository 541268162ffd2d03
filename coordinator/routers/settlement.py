"""Public settlement endpoints: where the deployment settles, its epochs, proofs to claim with,
and the ledger export anyone rebuilds an epoch's root from (``intellect-node verify-epoch``)."""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query

from intellect_protocol.coordinator.anchoring import Anchorer
from intellect_protocol.coordinator.context import Context
from intellect_protocol.coordinator.deps import Ctx, LedgerDep, Settings, client_rate_limit
from intellect_protocol.coordinator.errors import ApiError
from intellect_protocol.coordinator.ledger import Ledger
from intellect_protocol.coordinator.services import leaderboard, settlement
from intellect_protocol.coordinator.settings import CoordinatorSettings
from intellect_protocol.shared.schemas import Address, ErrorBody, ErrorCode
from intellect_protocol.shared.settlement import ChainInfo, EpochInfo, EpochProof, LedgerEntry, NodeSettlement, SettlementOverview

router = APIRouter(prefix="/v1/public", tags=["settlement"], dependencies=[Depends(client_rate_limit)])


@router.get("/chain", response_model=ChainInfo)
async def chain_info(ctx: Ctx, settings: Settings) -> ChainInfo:
    return _chain_info(ctx, settings)


def _chain_info(ctx: Context, settings: CoordinatorSettings) -> ChainInfo:
    anchorer = ctx.anchorer
    if anchorer is None:
        return ChainInfo(enabled=False)
    return ChainInfo(
        enabled=True,
        rpc_url=settings.chain.rpc_url,
        chain_id=anchorer.chain_id,
        token=settings.chain.token,
        stake_registry=settings.chain.stake_registry,
        distributor=settings.chain.distributor,
        sender=anchorer.sender.address,
        from_block=settings.chain.from_block,
    )


@router.get("/epochs", response_model=list[EpochInfo])
async def epochs(ledger: LedgerDep, limit: Annotated[int, Query(ge=1, le=500)] = 50) -> list[EpochInfo]:
    """Newest epochs first, each with its root's transaction once confirmed."""
    return await ledger.run(settlement.epoch_infos, limit)


@router.get("/epochs/{epoch}", response_model=EpochInfo, responses={404: {"model": ErrorBody}})
async def epoch(epoch: Annotated[int, Path(ge=1, le=2**31 - 1)], ledger: LedgerDep) -> EpochInfo:
    found = await ledger.run(settlement.epoch_infos, 1, epoch)
    if not found:
        raise ApiError(ErrorCode.not_found, f"No epoch {epoch}.")
    return found[0]


@router.get("/epochs/{epoch}/proofs/{address}", response_model=EpochProof, responses={404: {"model": ErrorBody}})
async def proof(epoch: Annotated[int, Path(ge=1, le=2**31 - 1)], address: Address, ledger: LedgerDep) -> EpochProof:
    """``address``'s cumulative final credit in ``epoch`` and its Merkle proof, for a claim."""
    found = await ledger.run(settlement.proof, epoch, address)
    if found is None:
        raise ApiError(ErrorCode.not_found, f"{address} has no final credit in epoch {epoch}.")
    return found


@router.get("/ledger", response_model=list[LedgerEntry])
async def ledger_export(
    ledger: LedgerDep, after: Annotated[int, Query(ge=0, le=2**31 - 1)] = 0, limit: Annotated[int, Query(ge=1, le=5000)] = 1000
) -> list[LedgerEntry]:
    """Ledger entries after id ``after``, oldest first: page with the last id you got."""
    return await ledger.run(settlement.ledger_page, after, limit)


@router.get("/settlement", response_model=SettlementOverview)
async def overview(
    ctx: Ctx, ledger: LedgerDep, settings: Settings, limit: Annotated[int, Query(ge=1, le=200)] = 50
) -> SettlementOverview:
    """Recent epochs, and for the leading nodes (and every slashed one) their stake, slashes and
    claims, read from the chain; the page shows this. Cached a few seconds: each answer costs a
    few chain reads per node, and nobody may make the coordinator hammer its RPC."""
    info, anchorer = _chain_info(ctx, settings), ctx.anchorer
    if anchorer is None:
        return SettlementOverview(chain=info)
    return await ctx.settlement_overviews.get(limit, lambda: _overview(anchorer, ledger, info, limit))


async def _overview(anchorer: Anchorer, ledger: Ledger, info: ChainInfo, limit: int) -> SettlementOverview:
    recent = await ledger.run(settlement.epoch_infos, 10)
    leading = [row.address for row in await ledger.run(leaderboard.ranking, ledger.now(), limit)]
    slashed = await ledger.run(settlement.slashed)
    earned = await ledger.run(settlement.anchored_leaves)
    addresses = list(dict.fromkeys(leading + sorted(slashed)))
    try:
        nodes = await asyncio.to_thread(settlement.node_settlement, anchorer.chain(), addresses, earned, slashed)
    except Exception as e:  # the chain is down: the ledger's side is still worth showing
        unknown = [
            NodeSettlement(
                address=a,
                staked=None,
                unbonding=None,
                slashed=str(slashed.get(a, 0)),
                earned=str(earned.get(a, 0)),
                claimed=None,
                claimable=None,
            )
            for a in addresses
        ]
        return SettlementOverview(chain=info, chain_error=f"{type(e).__name__}: {e}", epochs=recent, nodes=unknown)
    return SettlementOverview(chain=info, epochs=recent, nodes=nodes)
