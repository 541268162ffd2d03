"""Where rollout files live: a small interface, a local directory or an S3-compatible bucket behind it.

An upload is written to a staging file as it arrives (:mod:`coordinator.uploads`), then handed
to the store whole with :meth:`BlobStore.put_file`; reads come back as a stream of chunks. Both
block, so callers run them off the event loop. A store that cannot be written or read right now
(disk full, unmounted, bucket unreachable) raises :class:`BlobStoreUnavailable`, which the API
answers with 503 and Retry-After: nothing is recorded and the node, validator or trainer asks again.
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Protocol

KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}(/[A-Za-z0-9][A-Za-z0-9._-]{0,127}){0,4}")
CHUNK = 1 << 20


class BlobStoreUnavailable(Exception):
    """The store failed for a reason outside the request; retrying later may succeed."""


@dataclass(frozen=True)
class Blob:
    size: int
    chunks: Iterator[bytes]
    """The bytes, read as they are iterated (blocking: iterate off the event loop)."""


class BlobStore(Protocol):
    staging: Path
    """Where uploads are written as they arrive (for a local store, on its own filesystem)."""

    def put_file(self, key: str, path: Path) -> None:
        """Store the staged file at ``path`` under ``key``; the file is consumed (moved or deleted)."""

    def open(self, key: str) -> Blob:
        """The blob under ``key``; a store that cannot serve it raises before any byte is sent."""


def checked_key(key: str) -> str:
    if not KEY.fullmatch(key) or ".." in key:
        raise ValueError(f"invalid blob key {key!r}")
    return key


class LocalBlobStore:
    """Blobs as files under ``root``: a staged upload is fsynced and renamed into place."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.staging = root / ".incoming"

    def put_file(self, key: str, path: Path) -> None:
        target = self.root / checked_key(key)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "rb+") as f:
                os.fsync(f.fileno())
            os.replace(path, target)
        except OSError as e:
            raise BlobStoreUnavailable(f"cannot write {key} under {self.root}: {e}") from e
        finally:
            with contextlib.suppress(OSError):  # the store may be gone from under us
                path.unlink(missing_ok=True)

    def open(self, key: str) -> Blob:
        try:
            f = open(self.root / checked_key(key), "rb")
            size = os.fstat(f.fileno()).st_size
        except OSError as e:
            raise BlobStoreUnavailable(f"cannot read {key}: {e}") from e
        return Blob(size, _read_chunks(f))


def _read_chunks(f: BinaryIO) -> Iterator[bytes]:
    with f:
        while chunk := f.read(CHUNK):
            yield chunk


class S3BlobStore:
    """Blobs as objects of one bucket of an S3-compatible service (AWS S3, MinIO, Ceph, R2...).

    Credentials come from boto3's usual chain (``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``,
    ``~/.aws``, an instance role). Uploads are staged in a local temporary directory."""

    def __init__(self, bucket: str, *, prefix: str = "", endpoint_url: str | None = None, region: str | None = None) -> None:
        try:
            import boto3
            from botocore.config import Config
        except ImportError:
            raise ValueError("the s3 blob store needs boto3: pip install 'intellect-protocol[s3]'") from None

        self.bucket, self.prefix = bucket, prefix.strip("/")
        # A few quick attempts: a client waiting out an outage holds a worker thread and a request.
        config = Config(retries={"max_attempts": 2, "mode": "standard"}, connect_timeout=5, read_timeout=30)
        self.client = boto3.client("s3", endpoint_url=endpoint_url, region_name=region, config=config)
        self.staging = Path(tempfile.gettempdir()) / "intellect-uploads"

    def _name(self, key: str) -> str:
        return f"{self.prefix}/{checked_key(key)}" if self.prefix else checked_key(key)

    def put_file(self, key: str, path: Path) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            self.client.upload_file(str(path), self.bucket, self._name(key))
        except (BotoCoreError, ClientError) as e:
            raise BlobStoreUnavailable(f"cannot write {key} to bucket {self.bucket}: {e}") from e
        finally:
            path.unlink(missing_ok=True)

    def open(self, key: str) -> Blob:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            reply = self.client.get_object(Bucket=self.bucket, Key=self._name(key))
        except (BotoCoreError, ClientError) as e:
            raise BlobStoreUnavailable(f"cannot read {key} from bucket {self.bucket}: {e}") from e
        return Blob(int(reply["ContentLength"]), reply["Body"].iter_chunks(CHUNK))
