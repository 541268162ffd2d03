"""The public leaderboard page at ``/``: HTML, CSS and JS served by us (no CDN), reading /v1/public. The HTML
comes with a first paint of the figures rendered here (:mod:`coordinator.first_paint`); the script takes over."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from fastapi import APIRouter, Depends
from fastapi.responses import Response
from fastapi.staticfiles import StaticFiles
from sqlalchemy.orm import Session

from intellect_protocol.coordinator import first_paint
from intellect_protocol.coordinator.deps import Ctx, LedgerDep, Settings, client_rate_limit
from intellect_protocol.coordinator.services import leaderboard
from intellect_protocol.coordinator.settings import CoordinatorSettings

WEB = Path(__file__).resolve().parent.parent / "web"
router = APIRouter(include_in_schema=False)
static = StaticFiles(directory=WEB)


@router.get("/", dependencies=[Depends(client_rate_limit)])
async def leaderboard_page(ctx: Ctx, ledger: LedgerDep, settings: Settings) -> Response:
    async def render() -> bytes:
        run, view = await ledger.run(_first_paint, settings, ledger.now())
        page = (WEB / "index.html").read_text().replace("<!--run-->", run).replace("<!--view-->", view)
        return page.encode()

    # Rendered once per interval for every reader, as the public aggregates are.
    body = await ctx.public_reads.get(("first-paint",), render)
    return Response(body, media_type="text/html; charset=utf-8", headers={"cache-control": "no-cache"})


def _first_paint(session: Session, settings: CoordinatorSettings, now: datetime) -> tuple[str, str]:
    net = leaderboard.network(session, settings, now)
    rows = leaderboard.ranking(session, now, first_paint.FIRST_ROWS)
    return first_paint.run_line(net), first_paint.view(net, rows)
