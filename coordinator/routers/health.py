"""Liveness and metrics for the people and machines that run the coordinator."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import text

router = APIRouter(tags=["health"])


@router.get("/healthz")
def healthz(request: Request) -> JSONResponse:
    """200 when the database answers and every background loop finished a pass recently, else 503."""
    loops = {loop.name: loop.health() for loop in request.app.state.loops}
    try:
        with request.app.state.engine.connect() as connection:
            connection.execute(text("SELECT 1"))
        database = "ok"
    except Exception as e:  # reported, not raised: this endpoint exists to say what is wrong
        database = f"{type(e).__name__}: {e}"
    ok = database == "ok" and all(loop["alive"] for loop in loops.values())
    body: dict[str, object] = {"status": "ok" if ok else "degraded", "database": database, "loops": loops}
    if request.app.state.anchorer is not None:  # a chain outage is reported, never a reason for 503: the ledger goes on
        body["settlement"] = request.app.state.anchorer.status()
    return JSONResponse(body, status_code=200 if ok else 503)


@router.get("/metrics")
def metrics(request: Request) -> Response:
    return Response(generate_latest(request.app.state.metrics.registry), media_type=CONTENT_TYPE_LATEST)
