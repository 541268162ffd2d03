"""Where rollout files live: a small interface, a local directory behind it by default.

Deployments that outgrow one disk put an S3-compatible store behind the same two methods. A store
that cannot be written or read right now (disk full, unmounted, read-only) raises
:class:`BlobStoreUnavailable`, which the API answers with 503 and Retry-After: nothing is recorded and
the node, validator or trainer asks again.
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
from pathlib import Path
from typing import Protocol

KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}(/[A-Za-z0-9][A-Za-z0-9._-]{0,127}){0,4}")


class BlobStoreUnavailable(Exception):
    """The store failed for a reason outside the request; retrying later may succeed."""


class BlobStore(Protocol):
    def put(self, key: str, data: bytes) -> None: ...

    def get(self, key: str) -> bytes: ...


class LocalBlobStore:
    """Blobs as files under ``root``, written to a temp file, fsynced, then renamed into place."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def _path(self, key: str) -> Path:
        if not KEY.fullmatch(key) or ".." in key:
            raise ValueError(f"invalid blob key {key!r}")
        return self.root / key

    def put(self, key: str, data: bytes) -> None:
        path = self._path(key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".incoming-")
        except OSError as e:
            raise BlobStoreUnavailable(f"cannot write under {self.root}: {e}") from e
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException as e:
            with contextlib.suppress(OSError):  # the store may be gone from under us
                Path(tmp).unlink(missing_ok=True)
            if isinstance(e, OSError):
                raise BlobStoreUnavailable(f"cannot write {key}: {e}") from e
            raise

    def get(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except OSError as e:
            raise BlobStoreUnavailable(f"cannot read {key}: {e}") from e
