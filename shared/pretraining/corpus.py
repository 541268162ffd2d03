"""A tokenized corpus for pretraining: a directory holding ``corpus.json`` and shards named by their content.

A shard is a safetensors file with one int32 tensor, ``tokens``, of shape ``[rows, seq_len]``, saved as
``shards/<sha256 of its bytes>.safetensors``. A training shard packs documents (each ``<bos> ... <eos>``) end to
end and cuts them into rows, the last row padded; an evaluation shard holds one document a row, padded, so a
document's likelihood is its row's. The manifest names every shard by hash, so a shard fetched from anywhere (an
island, a blob store) is the one the run was created with or is refused: :func:`read_shard` checks the hash, the
size, the one tensor's name, type and shape, and that every id is in the vocabulary, before anything uses it.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from safetensors import SafetensorError
from safetensors.torch import load as load_safetensors
from safetensors.torch import save as save_safetensors

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


def pack(documents: list[list[int]], seq_len: int, pad_id: int) -> torch.Tensor:
    """``documents`` end to end, cut into rows of ``seq_len`` (the last padded with ``pad_id``)."""
    stream = [token for document in documents for token in document]
    rows = -(-len(stream) // seq_len)
    packed = torch.full((rows * seq_len,), pad_id, dtype=torch.int32)
    packed[: len(stream)] = torch.tensor(stream, dtype=torch.int32)
    return packed.view(rows, seq_len)


def one_per_row(documents: list[list[int]], seq_len: int, pad_id: int) -> torch.Tensor:
    """One document a row, each cut to ``seq_len`` and padded with ``pad_id``."""
    rows = torch.full((len(documents), seq_len), pad_id, dtype=torch.int32)
    for row, document in enumerate(documents):
        kept = document[:seq_len]
        rows[row, : len(kept)] = torch.tensor(kept, dtype=torch.int32)
    return rows


def write_shard(directory: Path, tokens: torch.Tensor, pad_id: int) -> ShardRef:
    """Save ``tokens`` (int32, ``[rows, seq_len]``) as a shard of the corpus in ``directory``; its reference."""
    data = save_safetensors({"tokens": tokens.to(torch.int32).contiguous()})
    ref = ShardRef(sha256=hashlib.sha256(data).hexdigest(), rows=tokens.shape[0], tokens=int((tokens != pad_id).sum()))
    path = shard_path(directory, ref)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, data)
    return ref


def shard_path(directory: Path, ref: ShardRef) -> Path:
    return directory / "shards" / f"{ref.sha256}.safetensors"


def read_shard(data: bytes, ref: ShardRef, manifest: CorpusManifest) -> torch.Tensor:
    """The tokens of a shard's bytes, if they are exactly the shard ``ref`` of ``manifest``; :class:`CorpusError` if not."""
    if len(data) > MAX_SHARD_BYTES:
        raise CorpusError(f"shard {ref.sha256[:12]} is {len(data)} bytes, over the {MAX_SHARD_BYTES} a shard may be")
    if hashlib.sha256(data).hexdigest() != ref.sha256:
        raise CorpusError(f"shard {ref.sha256[:12]}'s bytes have another hash: not the shard the corpus names")
    try:
        tensors = load_safetensors(data)
    except (SafetensorError, ValueError) as e:
        raise CorpusError(f"shard {ref.sha256[:12]} is not a safetensors file: {e}") from None
    tokens = tensors.get("tokens")
    if set(tensors) != {"tokens"} or tokens is None or tokens.dtype != torch.int32:
        raise CorpusError(f"shard {ref.sha256[:12]} must hold one int32 tensor named tokens, not {sorted(tensors)}")
    if tuple(tokens.shape) != (ref.rows, manifest.seq_len):
        raise CorpusError(f"shard {ref.sha256[:12]} has shape {tuple(tokens.shape)}, not ({ref.rows}, {manifest.seq_len})")
    if int(tokens.min()) < 0 or int(tokens.max()) >= manifest.vocab_size:
        raise CorpusError(f"shard {ref.sha256[:12]} has ids outside the vocabulary of {manifest.vocab_size}")
    if int((tokens != manifest.pad_id).sum()) != ref.tokens:
        raise CorpusError(f"shard {ref.sha256[:12]} does not hold the {ref.tokens} tokens the corpus says")
    return tokens


def load_shard(directory: Path, ref: ShardRef, manifest: CorpusManifest) -> torch.Tensor:
    """A shard of the corpus in ``directory``, checked as :func:`read_shard` does."""
    path = shard_path(directory, ref)
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise CorpusError(f"shard {ref.sha256[:12]} is missing from {directory}") from None
    if size > MAX_SHARD_BYTES:
        raise CorpusError(f"shard {ref.sha256[:12]} is {size} bytes, over the {MAX_SHARD_BYTES} a shard may be")
    return read_shard(path.read_bytes(), ref, manifest)


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
