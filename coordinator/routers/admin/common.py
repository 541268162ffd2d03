"""What every admin router shares: the scoped token dependencies and the audited unit of work."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Depends
from sqlalchemy.orm import Session

from intellect_protocol.coordinator.deps import require_admin
from intellect_protocol.coordinator.ledger import Ledger
from intellect_protocol.coordinator.models import AdminToken
from intellect_protocol.coordinator.services import audit
from intellect_protocol.shared.schemas import ErrorBody

T = TypeVar("T")

Reader = Depends(require_admin("read"))
OperateToken = Annotated[AdminToken, Depends(require_admin("operate"))]
AdminOnlyToken = Annotated[AdminToken, Depends(require_admin("admin"))]
NOT_FOUND: dict[int | str, dict[str, Any]] = {404: {"model": ErrorBody}}
CONFLICT: dict[int | str, dict[str, Any]] = {404: {"model": ErrorBody}, 409: {"model": ErrorBody}}


def admin_router(tag: str) -> APIRouter:
    return APIRouter(prefix="/v1/admin", tags=[f"admin: {tag}"], responses={401: {"model": ErrorBody}, 403: {"model": ErrorBody}})


async def audited(ledger: Ledger, token: AdminToken, action: str, target: str, work: Callable[[Session], T], **detail: Any) -> T:
    """Run ``work`` and record who did ``action`` to ``target`` in one transaction; nothing is recorded if it fails."""

    def run(session: Session) -> T:
        result = work(session)
        audit.record(session, token, action, target, detail, ledger.now())
        return result

    return await ledger.run(run)
