"""Moving one chunk: an HTTP Range GET read straight into a buffer, hashed and written at its
offset as it arrives.

Plain blocking ``http.client`` on worker threads, one kept-alive connection per thread and
server: socket reads, blake3 and ``pwrite`` all release the GIL on large buffers, so several
transfers use several cores; measured here it moves bytes ~4x faster than an asyncio HTTP
client, and faster than ``curl``.
"""

from __future__ import annotations

import http.client
import os
import threading
from urllib.parse import urlsplit

import blake3

from intellect_protocol.shared.tls import client_context, untrusted

BUFFER = 1 << 20
TIMEOUT_S = 60.0


class TransferError(OSError):
    """The source failed: unreachable, an error status, or a short or overlong answer."""


_local = threading.local()


def _connection(scheme: str, netloc: str) -> http.client.HTTPConnection:
    pool: dict[tuple[str, str], http.client.HTTPConnection] = _local.__dict__.setdefault("pool", {})
    conn = pool.get((scheme, netloc))
    if conn is None:
        if scheme == "https":
            conn = http.client.HTTPSConnection(netloc, timeout=TIMEOUT_S, context=client_context())
        else:
            conn = http.client.HTTPConnection(netloc, timeout=TIMEOUT_S)
        pool[(scheme, netloc)] = conn
    return conn


def _drop(scheme: str, netloc: str) -> None:
    conn = _local.__dict__.get("pool", {}).pop((scheme, netloc), None)
    if conn is not None:
        conn.close()


def fetch_range(url: str, fd: int, offset: int, length: int, expected: str) -> bool:
    """Bytes [offset, offset + length) of ``url`` into the open file ``fd`` at the same offset.

    True when they hash (blake3) to ``expected``; False when they do not (the bytes written
    are garbage a later attempt overwrites). :class:`TransferError` when the source fails.
    """
    parts = urlsplit(url)
    target = parts.path + (f"?{parts.query}" if parts.query else "")
    conn = _connection(parts.scheme, parts.netloc)
    try:
        conn.request("GET", target, headers={"Range": f"bytes={offset}-{offset + length - 1}"})
        reply = conn.getresponse()
        if reply.status != 206:
            reply.read(1 << 16)
            raise TransferError(f"{reply.status} from {url}")
        if reply.length != length:
            raise TransferError(f"{url} answered {reply.length} bytes for a {length}-byte range")
        hasher = blake3.blake3()
        view = memoryview(bytearray(min(BUFFER, length)))
        received = 0
        while received < length:
            # Fill the whole buffer before hashing and writing it: fewer, larger calls.
            want, filled = min(len(view), length - received), 0
            while filled < want:
                n = reply.readinto(view[filled:want])
                if not n:
                    raise TransferError(f"{url} closed after {received + filled} of {length} bytes")
                filled += n
            hasher.update(view[:want])
            os.pwrite(fd, view[:want], offset + received)
            received += want
        return hasher.hexdigest() == expected
    except (OSError, http.client.HTTPException) as e:
        _drop(parts.scheme, parts.netloc)
        if isinstance(e, TransferError):
            raise
        raise TransferError(untrusted(e, f"{parts.scheme}://{parts.netloc}") or f"{url}: {e}") from e
