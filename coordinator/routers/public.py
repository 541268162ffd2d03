"""Public, unauthenticated endpoints: what anyone may know about the network."""

from __future__ import annotations

import time

from fastapi import APIRouter, Depends, Request

from coordinator.deps import DbSession, Settings, client_rate_limit
from coordinator.services import nodes
from shared.schemas import PublicStatus
from shared.version import __version__

router = APIRouter(prefix="/v1/public", tags=["public"], dependencies=[Depends(client_rate_limit)])


@router.get("/status", response_model=PublicStatus)
def status(request: Request, session: DbSession, settings: Settings) -> PublicStatus:
    return PublicStatus(
        coordinator_version=__version__,
        min_node_version=settings.min_node_version,
        audience=request.app.state.audience,
        heartbeat_interval_s=settings.heartbeat_interval_s,
        signature_window_s=settings.signature_window_s,
        nodes=nodes.status_counts(session),
        server_time=time.time(),
    )
