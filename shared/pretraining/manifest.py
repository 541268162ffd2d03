"""A tokenized corpus' manifest, ``corpus.json``: its shards by content hash, the held-out and out-of-distribution
shards it is judged on, and the shapes every shard must have (:mod:`shared.pretraining.corpus` reads and writes the
shards). Free of torch, so the coordinator can hold a run's manifest."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from intellect_protocol.shared.files import write_atomic
from intellect_protocol.shared.shardcast.chunking import Hex64

MANIFEST = "corpus.json"
MAX_SHARD_BYTES = 64 * 1024 * 1024
"""A shard larger than this is refused unread: 16 M tokens, minutes of an island's inner steps."""
MAX_MANIFEST_BYTES = 16 * 1024 * 1024
MAX_SHARDS = 100_000


class CorpusError(ValueError):
    """A corpus or shard that is not what its manifest says: one sentence, naming what differs."""


class ShardRef(BaseModel):
    """A shard as the manifest names it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    sha256: Hex64
    """SHA-256 of the shard file's bytes, which is also its name."""
    rows: int = Field(ge=1, le=1 << 24)
    """Rows of ``seq_len`` tokens."""
    tokens: int = Field(ge=1, le=1 << 32)
    """Tokens that are not padding: what a shard contributes to "tokens trained"."""


class CorpusManifest(BaseModel):
    """``corpus.json``: what a pretraining run learns from and is judged on."""

    model_config = ConfigDict(extra="forbid")

    format: Literal[1] = 1
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    """A short name shown with the run."""
    seq_len: int = Field(ge=8, le=8192)
    """Tokens a row; one inner step's sequences are rows."""
    vocab_size: int = Field(ge=4, le=1 << 20)
    """Every id in every shard is below this: the model's embedding rows."""
    pad_id: int = Field(ge=0)
    """The id that fills rows past a document's end; no loss is taken on it."""
    tokenizer_sha256: Hex64
    """SHA-256 of the ``tokenizer.json`` that made the shards."""
    shards: list[ShardRef] = Field(min_length=1, max_length=MAX_SHARDS)
    """Training shards: each handed to one island once an epoch."""
    held_out: ShardRef
    """Documents of the training distribution never trained on, one a row: the held-out loss."""
    out_of_distribution: ShardRef | None = None
    """Documents of sources absent from the training shards, one a row: scored against ``held_out`` to tell
    them apart by likelihood (:func:`shared.pretraining.evaluation.auroc`)."""

    def every_shard(self) -> list[ShardRef]:
        return [*self.shards, self.held_out, *([self.out_of_distribution] if self.out_of_distribution else [])]


def load_manifest(directory: Path) -> CorpusManifest:
    """``directory``'s ``corpus.json``; :class:`CorpusError` with the reason if it is not one."""
    path = directory / MANIFEST
    if not path.is_file():
        raise CorpusError(f"{directory} has no {MANIFEST}: not a tokenized corpus")
    if path.stat().st_size > MAX_MANIFEST_BYTES:
        raise CorpusError(f"{path} is over {MAX_MANIFEST_BYTES} bytes")
    try:
        manifest = CorpusManifest.model_validate(json.loads(path.read_bytes()))
    except (ValueError, ValidationError) as e:
        raise CorpusError(f"{path} is not a corpus manifest: {e}") from None
    refs = manifest.every_shard()
    if len({ref.sha256 for ref in refs}) != len(refs):
        raise CorpusError(f"{path} names one shard twice: each shard is learnt from, or judged on, once")
    return manifest


def save_manifest(directory: Path, manifest: CorpusManifest) -> None:
    write_atomic(directory / MANIFEST, (manifest.model_dump_json(indent=2) + "\n").encode())
