"""The public leaderboard page at ``/``: static HTML, CSS and JS served by us (no CDN), reading /v1/public."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

WEB = Path(__file__).resolve().parent.parent / "web"
router = APIRouter(include_in_schema=False)
static = StaticFiles(directory=WEB)


@router.get("/")
async def leaderboard_page() -> FileResponse:
    return FileResponse(WEB / "index.html", headers={"cache-control": "no-cache"})
