"""Admin: bearer tokens (create, list, revoke); needs the admin scope."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import Path
from pydantic import AliasChoices, BaseModel, ConfigDict, Field
from sqlalchemy.orm import Session

from intellect_protocol.coordinator.deps import LedgerDep
from intellect_protocol.coordinator.errors import ApiError
from intellect_protocol.coordinator.routers.admin.common import CONFLICT, AdminOnlyToken, admin_router, audited
from intellect_protocol.coordinator.services import admin_tokens
from intellect_protocol.shared.schemas import INT32_MAX, ErrorCode, Scope

router = admin_router("tokens")


class TokenCreate(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"name": "grafana", "scope": "read"}]})
    name: str = Field(min_length=1, max_length=128)
    """Who or what the token is for."""
    scope: Scope = Scope.read
    """read, operate or admin; each includes the ones before it."""


class TokenOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)
    id: int
    name: str
    scope: Scope = Field(validation_alias=AliasChoices("scopes", "scope"))
    created_at: datetime
    revoked_at: datetime | None


class NewToken(TokenOut):
    token: str
    """The bearer token; shown this once, only its hash is stored."""


@router.get("/tokens", response_model=list[TokenOut])
async def list_tokens(ledger: LedgerDep, _: AdminOnlyToken) -> list[TokenOut]:
    """Every token ever made (never their secrets)."""
    return [TokenOut.model_validate(t) for t in await ledger.run(admin_tokens.list_tokens)]


@router.post("/tokens", response_model=NewToken, status_code=201)
async def create_token(body: TokenCreate, ledger: LedgerDep, token: AdminOnlyToken) -> NewToken:
    def work(session: Session) -> NewToken:
        row, plaintext = admin_tokens.create_token(session, body.name, body.scope, ledger.now())
        return NewToken(**TokenOut.model_validate(row).model_dump(), token=plaintext)

    return await audited(ledger, token, "tokens.create", body.name, work, scope=body.scope)


@router.delete("/tokens/{token_id}", response_model=TokenOut, responses=CONFLICT)
async def revoke_token(token_id: Annotated[int, Path(ge=1, le=INT32_MAX)], ledger: LedgerDep, token: AdminOnlyToken) -> TokenOut:
    """Revoke a token at once; requests carrying it are refused from now on."""

    def work(session: Session) -> TokenOut:
        row = admin_tokens.revoke_token(session, token_id, ledger.now())
        if row is None:
            raise ApiError(ErrorCode.not_found, f"No token {token_id}.")
        return TokenOut.model_validate(row)

    return await audited(ledger, token, "tokens.revoke", str(token_id), work)
