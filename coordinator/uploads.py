"""An upload's body written to a staging file as it arrives, hashed on the way, never whole in memory.

Parts of the body are gathered up to a mebibyte, then written and hashed on a worker thread
(hashlib and file writes let go of the GIL), so the event loop only moves small buffers and every
other request goes on meanwhile. The digest is the one the request's signature covers.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import tempfile
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import BinaryIO

from starlette.requests import Request

from intellect_protocol.coordinator.blobs import BlobStoreUnavailable

PIECE = 1 << 20


@dataclass(frozen=True)
class StagedUpload:
    path: Path
    sha256: str
    size: int
    started_at: datetime
    """When the body's first byte arrived."""

    def discard(self) -> None:
        self.path.unlink(missing_ok=True)


async def stage(request: Request, directory: Path) -> StagedUpload:
    """The request's body in a new file under ``directory``; the file is removed if the body never
    arrives whole (client gone, body too large or too slow)."""
    started_at = datetime.now(UTC)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(dir=directory, prefix="upload-")
    except OSError as e:
        raise BlobStoreUnavailable(f"cannot stage an upload under {directory}: {e}") from e
    path, digest, size = Path(name), hashlib.sha256(), 0
    try:
        with os.fdopen(fd, "wb") as f:
            pending: list[bytes] = []
            held = 0
            async for part in request.stream():
                pending.append(part)
                held += len(part)
                if held >= PIECE:
                    await asyncio.to_thread(_write, f, digest, pending)
                    size, pending, held = size + held, [], 0
            if pending:
                await asyncio.to_thread(_write, f, digest, pending)
                size += held
    except BaseException as e:
        with contextlib.suppress(OSError):
            await asyncio.to_thread(path.unlink, missing_ok=True)
        if isinstance(e, OSError):
            raise BlobStoreUnavailable(f"cannot stage an upload under {directory}: {e}") from e
        raise
    return StagedUpload(path, digest.hexdigest(), size, started_at)


def _write(f: BinaryIO, digest: hashlib._Hash, parts: list[bytes]) -> None:
    for part in parts:
        digest.update(part)
        f.write(part)
