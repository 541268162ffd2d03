"""A stored blob as an HTTP response: streamed in chunks from a worker thread, never whole in memory."""

from __future__ import annotations

import asyncio

from starlette.requests import Request
from starlette.responses import StreamingResponse


async def blob_response(request: Request, key: str) -> StreamingResponse:
    """The blob under ``key``; a store that cannot serve it raises before the status line is sent (503)."""
    blob = await asyncio.to_thread(request.app.state.blobs.open, key)
    # A sync iterator: Starlette reads each chunk on a worker thread.
    return StreamingResponse(blob.chunks, media_type="application/octet-stream", headers={"content-length": str(blob.size)})
