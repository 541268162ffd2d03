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
import logging
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load as load_safetensors
from safetensors.torch import save as save_safetensors

from intellect_protocol.shared.files import write_atomic
from intellect_protocol.shared.pretraining.manifest import MAX_SHARD_BYTES, CorpusError, CorpusManifest, ShardRef


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


def fetch_shard(fetch: Callable[[str], bytes], ref: ShardRef, manifest: CorpusManifest, cache: Path) -> torch.Tensor:
    """A shard's tokens from ``cache`` (a directory), or else ``fetch(sha256)`` (the coordinator), checked against the
    manifest before a byte is kept or used: a cached copy that is not the shard is fetched again."""
    cached = cache / f"{ref.sha256}.safetensors"
    if cached.is_file():
        try:
            return read_shard(cached.read_bytes(), ref, manifest)
        except CorpusError as e:
            logging.getLogger("intellect.pretraining").warning("fetching shard %s again: %s", ref.sha256[:12], e)
    data = fetch(ref.sha256)
    tokens = read_shard(data, ref, manifest)
    cache.mkdir(parents=True, exist_ok=True)
    cached.write_bytes(data)
    return tokens
