"""The HTTP face of an origin or a relay (an ASGI app; many clients at once).

- ``GET /v1/steps``: the steps held here and how many of their chunks are verified.
- ``GET /v1/runs/{run}/steps/{step}/chunks``: which chunks of a step are verified here.
- ``GET /v1/runs/{run}/steps/{step}/files/{path}``: a file's bytes, ``Range: bytes=a-b`` for
  a part (206). Bytes leave only once their chunk is verified; a request for a chunk the relay
  is still fetching waits for it (up to ``wait_s``) and streams it the moment it lands, which is
  what lets a tree of relays pipeline: the client reads chunk i while the relay fetches i + 1.

Files are read in place with ``pread``; nothing is copied into shard files.
"""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from intellect_protocol.shared.shardcast.store import Step, StepStore, held_map

PIECE = 1 << 20
RANGE = re.compile(r"bytes=(\d{1,15})-(\d{0,15})")
UNKNOWN_STEP_WAIT_S = 2.0
"""How long a request for a step this server has not heard of yet waits for it (the
coordinator announces steps to relays and clients at nearly the same moment)."""


def _error(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"code": code, "message": message}, status_code=status, headers=headers)


def create_server(store: StepStore, *, wait_s: float = 30.0) -> FastAPI:
    app = FastAPI(title="Intellect Protocol shardcast server", docs_url=None, redoc_url=None)
    app.state.store = store

    async def find(run_id: str, step: int) -> Step | None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + UNKNOWN_STEP_WAIT_S
        while (found := store.get(run_id, step)) is None and loop.time() < deadline:
            if store.complete_on_disk:
                store.scan()
            await asyncio.sleep(0.05)
        return found

    @app.get("/healthz")
    async def healthz() -> dict[str, object]:
        return {"status": "ok", "pid": os.getpid()}  # the pid tells its launcher it from a server that took the port

    @app.get("/v1/steps")
    async def steps() -> list[dict[str, object]]:
        return [
            {"run_id": run_id, "step": number, "chunks": len(s.manifest.chunks), "held": len(s.held)}
            for (run_id, number), s in sorted(store.steps.items())
            if s.retired_at is None
        ]

    @app.get("/v1/runs/{run_id}/steps/{step}/chunks")
    async def chunks(run_id: str, step: int) -> Response:
        found = await find(run_id, step)
        if found is None:
            return _error(404, "not_found", f"No step {step} of {run_id} here.")
        return JSONResponse(held_map(found))

    @app.get("/v1/runs/{run_id}/steps/{step}/files/{path:path}")
    async def file_bytes(run_id: str, step: int, path: str, request: Request) -> Response:
        found = await find(run_id, step)
        if found is None:
            return _error(404, "not_found", f"No step {step} of {run_id} here.")
        index = next((i for i, f in enumerate(found.manifest.files) if f.path == path), None)
        if index is None:
            return _error(404, "not_found", f"Step {step} has no file {path!r}.")
        size = found.manifest.files[index].size
        start, end, status = 0, size, 200
        if (header := request.headers.get("range")) is not None:
            match = RANGE.fullmatch(header.strip())
            if match is None:
                return _error(416, "range_not_satisfiable", "One range, as bytes=START-END, is supported.")
            start = int(match[1])
            end = min(int(match[2]) + 1 if match[2] else size, size)
            if start >= end:
                return _error(416, "range_not_satisfiable", f"{path} has {size} bytes.", {"Content-Range": f"bytes */{size}"})
            status = 206
        needed = found.chunks_for(index, start, end)
        if needed and not await found.wait_held(needed[:1], wait_s):
            return _error(503, "not_ready", "That chunk is not verified here yet; try another source.", {"Retry-After": "1"})
        headers = {"Accept-Ranges": "bytes", "Content-Length": str(end - start)}
        if status == 206:
            headers["Content-Range"] = f"bytes {start}-{end - 1}/{size}"
        return StreamingResponse(
            _stream(found, found.dir / path, index, start, end, wait_s),
            status_code=status,
            headers=headers,
            media_type="application/octet-stream",
        )

    return app


async def _stream(
    step: Step, path: os.PathLike[str], file_index: int, start: int, end: int, wait_s: float
) -> AsyncIterator[bytes]:
    """Bytes [start, end) of a file, each chunk's once it is verified. ``step.readers`` counts
    this response while it runs, so retention never deletes a step under it."""
    step.readers += 1
    fd = os.open(path, os.O_RDONLY)
    try:
        position = start
        for index in step.chunks_for(file_index, start, end):
            chunk = step.manifest.chunks[index]
            if not await step.wait_held([index], wait_s):
                raise TimeoutError(f"chunk {index} of step {step.manifest.step} was not verified within {wait_s} s")
            stop = min(end, chunk.offset + chunk.length)
            while position < stop:
                # pread from the page cache takes microseconds; a thread hop would cost more.
                data = os.pread(fd, min(PIECE, stop - position), position)
                if not data:
                    raise OSError(f"{path} is shorter than its manifest says")
                position += len(data)
                yield data
    finally:
        os.close(fd)
        step.readers -= 1
