"""A policy step's manifest: its files, their chunks and each chunk's blake3, signed by the trainer.

The signature covers ``intellect-manifest-v1`` and the sha256 of the manifest's canonical JSON
(:meth:`Manifest.canonical`), so any change to a file, a size or a hash breaks it. Manifests
arrive from the network; :class:`Manifest` validation refuses unsafe paths and chunk lists
that do not tile every file exactly, so a verified manifest can drive writes to disk.
"""

from __future__ import annotations

import hashlib
import os
import re
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Annotated, Literal

import blake3
from eth_account.signers.local import LocalAccount
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from intellect_protocol.shared.schemas import Address
from intellect_protocol.shared.shardcast.chunking import DEFAULT_CHUNK_SIZE, Hex64
from intellect_protocol.shared.signing import recover_text_signer, sign_text

SCHEME = "intellect-manifest-v1"
MAX_FILES = 1024
MAX_CHUNKS = 1 << 17
HASH_BLOCK = 2**20

_SEGMENT = re.compile(r"[A-Za-z0-9._-]{1,128}")


def _safe_path(path: str) -> str:
    segments = path.split("/")
    if len(segments) > 8 or any(not _SEGMENT.fullmatch(s) or s in (".", "..") for s in segments):
        raise ValueError("must be a relative path of plain segments (letters, digits, . _ -; no '..')")
    return path


SafePath = Annotated[str, Field(max_length=255), AfterValidator(_safe_path)]
"""A relative path of plain segments: no ``..``, no ``.``, no absolute paths, no odd characters."""


class ManifestError(ValueError):
    """A manifest that cannot be trusted: bad signature, wrong signer, or inconsistent layout."""


class FileEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    path: SafePath
    size: int = Field(ge=0, le=2**44)


class Chunk(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    file: int = Field(ge=0)
    """Index into :attr:`Manifest.files`."""
    offset: int = Field(ge=0)
    length: int = Field(gt=0)
    blake3: Hex64


class Manifest(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    version: Literal[1] = 1
    run_id: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9._-]+$")]
    step: int = Field(ge=1)
    """Policy step; step 0 is the run's base model, which needs no broadcast."""
    config_hash: Hex64
    """sha256 of the model's ``config.json``: the architecture these weights fit."""
    chunk_size: int = Field(ge=4096, le=2**31)
    created_at: int = Field(ge=0)
    files: list[FileEntry] = Field(min_length=1, max_length=MAX_FILES)
    chunks: list[Chunk] = Field(max_length=MAX_CHUNKS)

    @model_validator(mode="after")
    def _chunks_tile_files(self) -> Manifest:
        paths = [f.path for f in self.files]
        if len(set(paths)) != len(paths):
            raise ValueError("file paths repeat")
        expected = [
            (i, off, min(self.chunk_size, f.size - off))
            for i, f in enumerate(self.files)
            for off in range(0, f.size, self.chunk_size)
        ]
        if [(c.file, c.offset, c.length) for c in self.chunks] != expected:
            raise ValueError("chunks must tile every file in order, chunk_size bytes each (the last of a file shorter)")
        return self

    def canonical(self) -> bytes:
        return self.model_dump_json().encode()

    def digest(self) -> str:
        return hashlib.sha256(self.canonical()).hexdigest()

    def content_digest(self) -> str:
        """The digest of what the step holds, whenever it was built: two builds of the same files in the same
        chunks agree on it (trainer islands vouch for a step by it)."""
        return hashlib.sha256(self.model_dump_json(exclude={"created_at"}).encode()).hexdigest()

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)


class SignedManifest(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    manifest: Manifest
    signer: Address
    signature: Annotated[str, Field(pattern=r"^0x[0-9a-fA-F]{130}$")]

    def verify(self, trusted: set[str] | None = None) -> Manifest:
        """The manifest, if ``signature`` is ``signer``'s over it (and ``signer`` is in ``trusted``)."""
        try:
            recovered = recover_text_signer(_message(self.manifest), self.signature)
        except ValueError as e:
            raise ManifestError(f"manifest signature: {e}") from None
        if recovered != self.signer:
            raise ManifestError(f"manifest for step {self.manifest.step} is not signed by {self.signer}")
        if trusted is not None and self.signer not in trusted:
            raise ManifestError(f"manifest signer {self.signer} does not hold the trainer role")
        return self.manifest


def _message(manifest: Manifest) -> str:
    return f"{SCHEME}\n{manifest.digest()}"


def sign_manifest(manifest: Manifest, account: LocalAccount) -> SignedManifest:
    return SignedManifest(manifest=manifest, signer=account.address, signature=sign_text(account, _message(manifest)))


HASH_PIECE = 1 << 20


def _file_chunks(path: Path, size: int, chunk_size: int) -> Iterator[tuple[int, int, str]]:
    """``(offset, length, blake3)`` of each chunk of ``path``, read a piece at a time into one buffer:
    a fresh chunk-sized buffer for every chunk costs more in page faults than the hashing (measured:
    0.65 s a GiB to read into fresh 32 MiB buffers, 0.23 s to read and hash through one 1 MiB buffer)."""
    view = memoryview(bytearray(min(HASH_PIECE, chunk_size)))
    with path.open("rb") as f:
        for offset in range(0, size, chunk_size):
            length = min(chunk_size, size - offset)
            hasher, done = blake3.blake3(), 0
            while done < length:
                n = os.preadv(f.fileno(), [view[: min(len(view), length - done)]], offset + done)
                if not n:
                    raise ManifestError(f"{path} shrank while it was hashed")
                hasher.update(view[:n])
                done += n
            yield offset, length, hasher.hexdigest()


def build_manifest(
    step_dir: Path, run_id: str, step: int, *, chunk_size: int = DEFAULT_CHUNK_SIZE, created_at: int | None = None
) -> Manifest:
    """The manifest of every file under ``step_dir`` (a Hugging Face model directory)."""
    paths = sorted(p for p in step_dir.rglob("*") if p.is_file() and not p.name.startswith("."))
    if not paths:
        raise ManifestError(f"{step_dir} holds no files")
    config = step_dir / "config.json"
    if not config.is_file():
        raise ManifestError(f"{step_dir} has no config.json")
    files, chunks = [], []
    for index, path in enumerate(paths):
        size = path.stat().st_size
        files.append(FileEntry(path=path.relative_to(step_dir).as_posix(), size=size))
        chunks += [Chunk(file=index, offset=o, length=n, blake3=h) for o, n, h in _file_chunks(path, size, chunk_size)]
    return Manifest(
        run_id=run_id,
        step=step,
        config_hash=hashlib.sha256(config.read_bytes()).hexdigest(),
        chunk_size=chunk_size,
        created_at=int(time.time()) if created_at is None else created_at,
        files=files,
        chunks=chunks,
    )


class ManifestEntry(BaseModel):
    """A signed manifest as the coordinator's log holds it."""

    id: int
    """Position in the coordinator's manifest log: long-poll with ``after=`` the last one seen."""
    run_id: str
    step: int
    signed: SignedManifest
    created_at: datetime
