"""Admin: roles (grant and revoke validator, trainer, relay) and the relays that registered."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict
from sqlalchemy.orm import Session

from intellect_protocol.coordinator.deps import LedgerDep
from intellect_protocol.coordinator.routers.admin.common import NOT_FOUND, AdminOnlyToken, Reader, admin_router, audited
from intellect_protocol.coordinator.services import committee, roles, shardcast
from intellect_protocol.shared.relay_schemas import RelayInfo
from intellect_protocol.shared.schemas import Address, RoleName

router = admin_router("roles and relays")


class RoleGrant(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"address": "0x52908400098527886E0F7030069857D2E4169EE7", "role": "validator"}]},
    )
    address: Address
    role: RoleName


class RoleOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)
    address: str
    role: RoleName
    granted_by: str
    granted_at: datetime
    revoked_at: datetime | None


class RelayOut(RelayInfo):
    registered_at: datetime
    reports: int
    """Reports from clients naming this relay's URL (bad chunks, failures)."""


@router.get("/roles", response_model=list[RoleOut], dependencies=[Reader])
async def list_roles(ledger: LedgerDep) -> list[RoleOut]:
    return [RoleOut.model_validate(r) for r in await ledger.run(roles.active_roles)]


@router.post("/roles", response_model=RoleOut, status_code=201)
async def grant_role(body: RoleGrant, ledger: LedgerDep, token: AdminOnlyToken) -> RoleOut:
    """Grant ``validator``, ``trainer`` or ``relay`` to an address (idempotent)."""

    def work(session: Session) -> RoleOut:
        return RoleOut.model_validate(roles.grant(session, body.address, body.role, f"token:{token.name}", ledger.now()))

    return await audited(ledger, token, "roles.grant", body.address, work, role=body.role)


@router.delete("/roles/{address}/{role}", response_model=RoleOut, responses=NOT_FOUND)
async def revoke_role(address: Address, role: RoleName, ledger: LedgerDep, token: AdminOnlyToken) -> RoleOut:
    def work(session: Session) -> RoleOut:
        revoked = roles.revoke(session, address, role, ledger.now())
        if role == RoleName.validator:
            committee.release_assignments(session, address)
        return RoleOut.model_validate(revoked)

    return await audited(ledger, token, "roles.revoke", address, work, role=role)


@router.get("/relays", response_model=list[RelayOut], dependencies=[Reader])
async def list_relays(ledger: LedgerDep) -> list[RelayOut]:
    """Every relay that registered: URL, last seen, and how many bad-chunk or failure reports name it."""
    rows = await ledger.run(shardcast.all_relays)
    return [
        RelayOut(address=r.address, url=r.url, kind=r.kind, last_seen=r.last_seen, registered_at=r.registered_at, reports=n)
        for r, n in rows
    ]
