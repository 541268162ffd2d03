"""The rollout file: what a node uploads for one task, as Parquet with an explicit schema.

One row per sample. The schema is versioned (``intellect.schema`` in the file metadata) and
read strictly: a file whose columns, types or values fall outside :data:`SCHEMA` and
:class:`ReadLimits` is refused with :class:`RolloutFileError`, whose message says what is
wrong. Token ids, never text.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass, fields

import pyarrow as pa
import pyarrow.parquet as pq

VERSION = "rollout-v1"
FINISH_REASONS = ("stop", "length")

SCHEMA = pa.schema(
    [
        ("task_id", pa.string()),
        ("run_id", pa.string()),
        ("policy_step", pa.int64()),
        ("prompt_id", pa.string()),
        ("prompt_tokens", pa.list_(pa.int32())),
        ("completion_tokens", pa.list_(pa.int32())),
        ("logprobs", pa.list_(pa.float32())),
        ("finish_reason", pa.string()),
        ("reward", pa.float64()),
        ("task_reward", pa.float64()),
        ("length_penalty", pa.float64()),
        ("target_length", pa.int32()),
        ("seed", pa.int64()),
        ("proofs", pa.binary()),
    ],
    metadata={"intellect.schema": VERSION},
)


@dataclass
class Rollout:
    task_id: str
    run_id: str
    policy_step: int
    prompt_id: str
    prompt_tokens: list[int]
    completion_tokens: list[int]
    logprobs: list[float]
    finish_reason: str
    reward: float
    task_reward: float
    length_penalty: float
    target_length: int
    seed: int
    proofs: bytes


@dataclass(frozen=True)
class ReadLimits:
    max_rows: int = 4096
    max_tokens: int = 1 << 17
    """Longest prompt or completion."""
    vocab_size: int = 1 << 20
    """Token ids must be below this (the run's model's vocabulary)."""
    max_decoded_bytes: int = 1 << 30
    """Largest size the file may decompress to (a few compressed MB can claim gigabytes)."""


class RolloutFileError(ValueError):
    """A rollout file that is not one; the message says what is wrong."""


def write_rollouts(rollouts: list[Rollout]) -> bytes:
    columns = {f.name: [getattr(r, f.name) for r in rollouts] for f in fields(Rollout)}
    buffer = io.BytesIO()
    pq.write_table(pa.Table.from_pydict(columns, schema=SCHEMA), buffer, compression="zstd")
    return buffer.getvalue()


def read_rollouts(data: bytes, limits: ReadLimits | None = None) -> list[Rollout]:
    """Parse untrusted bytes into rollouts, or raise :class:`RolloutFileError`."""
    limits = limits or ReadLimits()
    try:
        parquet = pq.ParquetFile(io.BytesIO(data))
        schema = parquet.schema_arrow
        if (schema.metadata or {}).get(b"intellect.schema") != VERSION.encode():
            raise RolloutFileError(f"not a {VERSION} file (metadata intellect.schema missing or different)")
        if not schema.remove_metadata().equals(SCHEMA.remove_metadata()):
            raise RolloutFileError(f"columns or types differ from {VERSION}: got {schema.remove_metadata().to_string()}")
        if parquet.metadata.num_rows > limits.max_rows:
            raise RolloutFileError(f"{parquet.metadata.num_rows} rows, at most {limits.max_rows} allowed")
        # Decode a few rows at a time, so a small file that expands enormously is refused early.
        batches, decoded = [], 0
        for batch in parquet.iter_batches(batch_size=64):
            decoded += batch.nbytes
            if decoded > limits.max_decoded_bytes:
                raise RolloutFileError(f"decompresses to over {limits.max_decoded_bytes} bytes")
            batches.append(batch)
        table = pa.Table.from_batches(batches, schema=parquet.schema_arrow)
    except RolloutFileError:
        raise
    except Exception as e:  # pyarrow raises many types for corrupt files
        raise RolloutFileError(f"not a readable Parquet file ({type(e).__name__}: {e})") from None
    for name in table.column_names:
        if table.column(name).null_count:
            raise RolloutFileError(f"column {name} has nulls")
    rollouts = [Rollout(**row) for row in table.to_pylist()]
    if not rollouts:
        raise RolloutFileError("the file has no rows")
    for number, r in enumerate(rollouts):
        _check(r, number, limits)
    return rollouts


def _check(r: Rollout, row: int, limits: ReadLimits) -> None:
    def fail(why: str) -> RolloutFileError:
        return RolloutFileError(f"row {row}: {why}")

    for name, tokens in (("prompt_tokens", r.prompt_tokens), ("completion_tokens", r.completion_tokens)):
        if not 1 <= len(tokens) <= limits.max_tokens:
            raise fail(f"{name} has {len(tokens)} tokens (1..{limits.max_tokens} allowed)")
        if min(tokens) < 0 or max(tokens) >= limits.vocab_size:
            raise fail(f"{name} has a token id outside 0..{limits.vocab_size - 1}")
    if len(r.logprobs) != len(r.completion_tokens):
        raise fail(f"{len(r.logprobs)} logprobs for {len(r.completion_tokens)} completion tokens")
    if not all(math.isfinite(x) and x <= 0 for x in r.logprobs):
        raise fail("logprobs must be finite and <= 0")
    if r.finish_reason not in FINISH_REASONS:
        raise fail(f"finish_reason {r.finish_reason!r} is not one of {FINISH_REASONS}")
    for name in ("reward", "task_reward", "length_penalty"):
        if not math.isfinite(getattr(r, name)):
            raise fail(f"{name} is not finite")
    if r.length_penalty < 0 or abs(r.reward - (r.task_reward - r.length_penalty)) > 1e-6:
        raise fail("reward must equal task_reward - length_penalty, with a penalty >= 0")
    if r.policy_step < 0 or r.target_length < 0 or r.seed < 0:
        raise fail("policy_step, target_length and seed must be >= 0")
    if len(r.proofs) % 2 or len(r.proofs) > 258 * (len(r.completion_tokens) // 32 + 1):
        raise fail(f"proofs are {len(r.proofs)} bytes, not a whole number of chunks for this completion")
    if not (r.task_id and r.run_id and r.prompt_id) or max(len(r.task_id), len(r.run_id), len(r.prompt_id)) > 128:
        raise fail("task_id, run_id and prompt_id must be 1..128 characters")
