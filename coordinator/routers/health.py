"""Liveness and metrics for the people and machines that run the coordinator."""

from __future__ import annotations

import os

from fastapi import APIRouter, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import text

from intellect_protocol.coordinator.deps import Ctx

router = APIRouter(tags=["health"])


@router.get("/healthz")
def healthz(ctx: Ctx) -> JSONResponse:
    """200 when the database answers and every background loop finished a pass recently, else 503; with the server's
    process id, so whoever started it can tell it from another server that took the port first."""
    loops = {loop.name: loop.health() for loop in ctx.loops}
    try:
        with ctx.engine.connect() as connection:
            connection.execute(text("SELECT 1"))
        database = "ok"
    except Exception as e:  # reported, not raised: this endpoint exists to say what is wrong
        database = f"{type(e).__name__}: {e}"
    ok = database == "ok" and all(loop["alive"] for loop in loops.values())
    body: dict[str, object] = {"status": "ok" if ok else "degraded", "database": database, "loops": loops, "pid": os.getpid()}
    if ctx.anchorer is not None:  # a chain outage is reported, never a reason for 503: the ledger goes on
        body["settlement"] = ctx.anchorer.status()
    return JSONResponse(body, status_code=200 if ok else 503)


@router.get("/metrics")
def metrics(ctx: Ctx) -> Response:
    return Response(generate_latest(ctx.metrics.registry), media_type=CONTENT_TYPE_LATEST)
