"""A stored blob as an HTTP response: streamed in chunks from a worker thread, never whole in memory."""

from __future__ import annotations

import asyncio

from starlette.responses import StreamingResponse

from intellect_protocol.coordinator.blobs import BlobStore


async def blob_response(blobs: BlobStore, key: str) -> StreamingResponse:
    """The blob under ``key`` in ``blobs``; a store that cannot serve it raises before the status line is sent (503)."""
    blob = await asyncio.to_thread(blobs.open, key)
    # A sync iterator: Starlette reads each chunk on a worker thread.
    return StreamingResponse(blob.chunks, media_type="application/octet-stream", headers={"content-length": str(blob.size)})
