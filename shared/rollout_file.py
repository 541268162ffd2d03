"""The rollout file: what a node uploads for one task, as Parquet with an explicit schema.

One row per sample. The schema is versioned (``intellect.schema`` in the file metadata) and
read strictly: a file whose columns, types or values fall outside its version's schema and
:class:`ReadLimits` is refused with :class:`RolloutFileError`, whose message says what is
wrong. Token ids, never text.

Two versions. ``rollout-v1`` (:data:`SCHEMA`): every completion token was sampled by the model. ``rollout-v2``
(:data:`SCHEMA_V2`) adds ``sampled``, one flag per completion token: False where the environment wrote the token
(a tool's result, a reply in a multi-turn episode). The completion is then the whole episode after the prompt, the
model's turns and the environment's in order; a turn is a run of tokens from one side. An environment's token
carries a logprob of exactly 0 (it was not drawn), and the first token is always the model's. A file is written
as v1 whenever every token was sampled, so single-turn work is byte for byte what it was.
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable
from dataclasses import dataclass, fields

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from intellect_protocol.shared.cpu_ledger import spent
from intellect_protocol.shared.numerics import METADATA_KEY, Numerics
from intellect_protocol.shared.parquet_pages import PageHeaderError, column_pages

VERSION = "rollout-v1"
VERSION_V2 = "rollout-v2"
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
SCHEMA_V2 = SCHEMA.append(pa.field("sampled", pa.list_(pa.bool_()))).with_metadata({"intellect.schema": VERSION_V2})


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
    sampled: list[bool] | None = None
    """Per completion token, whether the model sampled it (False: the environment wrote it); None: every one was."""

    def sampled_tokens(self) -> int:
        """Completion tokens the model sampled: the ones a trainer learns from."""
        return len(self.completion_tokens) if self.sampled is None else sum(self.sampled)

    def environment_turns(self) -> int:
        """Runs of the environment's tokens in the completion."""
        flags = self.sampled or []
        return sum(1 for i, s in enumerate(flags) if not s and (i == 0 or flags[i - 1]))


PROOF_BYTES_PER_CHUNK = 258
ID_CHARS = 128


@dataclass(frozen=True)
class ReadLimits:
    """What a file may hold. Every size is checked against what the file's page headers declare
    before anything is decoded, so a small file that claims a huge one costs only its header walk."""

    max_rows: int = 4096
    max_tokens: int = 1 << 17
    """Longest completion."""
    max_prompt_tokens: int = 1 << 15
    """Longest prompt."""
    vocab_size: int = 1 << 20
    """Token ids must be below this (the run's model's vocabulary)."""
    max_environment_tokens: int = 0
    """Most tokens of a completion the environment may have written (0: a single-turn run's, where none may)."""
    max_environment_turns: int = 0
    """Most environment turns in one completion."""
    max_decoded_bytes: int = 512 << 20
    """Largest size the file may decode to, declared or actual (a few compressed KB can claim gigabytes)."""

    @classmethod
    def for_task(cls, rows: int, max_tokens: int, environment_tokens: int = 0, environment_turns: int = 0) -> ReadLimits:
        """Exactly ``rows`` rows of completions of at most ``max_tokens``, of which the environment may have written
        ``environment_tokens`` in ``environment_turns`` turns: the tightest bound for one task's file."""
        most = worst_case_bytes(rows, max_tokens, multi_turn=environment_tokens > 0)
        return cls(
            max_rows=rows,
            max_tokens=max_tokens,
            max_decoded_bytes=min(cls.max_decoded_bytes, most),
            max_environment_tokens=environment_tokens,
            max_environment_turns=environment_turns,
        )


ADMITTED = ReadLimits(max_environment_tokens=ReadLimits.max_tokens, max_environment_turns=ReadLimits.max_tokens)
"""Limits for a file its run's rules admitted already (an accepted file, as the trainer reads it): whatever episode
bounds the run's environment set, the coordinator and the validators held the file to them."""


def worst_case_bytes(rows: int, max_tokens: int, multi_turn: bool = False) -> int:
    """Decoded size of the largest valid file of ``rows`` rows (values, offsets and levels)."""
    # Prompt and completion ids, one logprob per completion token, and in v2 one flag per completion token.
    tokens = ReadLimits.max_prompt_tokens + (3 if multi_turn else 2) * max_tokens
    per_row = 8 * tokens + proof_bytes(max_tokens) + 4 * ID_CHARS + 256
    return rows * per_row


def proof_bytes(max_tokens: int) -> int:
    return PROOF_BYTES_PER_CHUNK * (max_tokens // 32 + 1)


def shape_error(rows: int, max_tokens: int) -> str | None:
    """Why a task of ``rows`` rows of up to ``max_tokens`` could never be submitted, or None."""
    limits = ReadLimits()
    if rows > limits.max_rows:
        return f"a task would hold {rows} rows (prompts x samples); a rollout file holds at most {limits.max_rows}"
    if max_tokens > limits.max_tokens:
        return f"completions of {max_tokens} tokens exceed the rollout file's {limits.max_tokens}"
    if worst_case_bytes(rows, max_tokens) > limits.max_decoded_bytes:
        return (
            f"a task's file could decode to {worst_case_bytes(rows, max_tokens) >> 20} MiB, over the "
            f"{limits.max_decoded_bytes >> 20} MiB a rollout file may hold: fewer prompts, samples or tokens per task"
        )
    return None


class RolloutFileError(ValueError):
    """A rollout file that is not one; the message says what is wrong."""


@spent("file writing")
def write_rollouts(rollouts: list[Rollout], numerics: Numerics | None = None) -> bytes:
    """The file for ``rollouts``, declaring how they were computed (default ``torch/float32``); v1 when every
    completion token was sampled, else v2."""
    columns = {f.name: [getattr(r, f.name) for r in rollouts] for f in fields(Rollout)}
    multi_turn = any(r.sampled is not None and not all(r.sampled) for r in rollouts)
    if multi_turn:
        columns["sampled"] = [r.sampled if r.sampled is not None else [True] * len(r.completion_tokens) for r in rollouts]
    else:
        del columns["sampled"]
    base = SCHEMA_V2 if multi_turn else SCHEMA
    schema = base.with_metadata({**base.metadata, METADATA_KEY.encode(): str(numerics or Numerics()).encode()})
    buffer = io.BytesIO()
    pq.write_table(pa.Table.from_pydict(columns, schema=schema), buffer, compression="zstd")
    return buffer.getvalue()


def read_numerics(data: bytes) -> Numerics:
    """The numerics a file declares (``torch/float32`` when it declares none), or :class:`RolloutFileError`."""
    try:
        declared = (pq.ParquetFile(io.BytesIO(data)).schema_arrow.metadata or {}).get(METADATA_KEY.encode())
        return Numerics.parse(declared.decode()) if declared is not None else Numerics()
    except (ValueError, UnicodeDecodeError) as e:
        raise RolloutFileError(f"declared numerics: {e}") from None
    except Exception as e:  # pyarrow raises many types for corrupt files
        raise RolloutFileError(f"not a readable Parquet file ({type(e).__name__}: {e})") from None


TEXT_COLUMNS = ("task_id", "run_id", "prompt_id", "finish_reason", "proofs")


@spent("file parsing")
def read_rollouts(data: bytes, limits: ReadLimits | None = None) -> list[Rollout]:
    """Parse untrusted bytes into rollouts, or raise :class:`RolloutFileError`."""
    limits = limits or ReadLimits()
    try:
        parquet = pq.ParquetFile(io.BytesIO(data))
        schema = parquet.schema_arrow
        version = (schema.metadata or {}).get(b"intellect.schema")
        expected = {VERSION.encode(): SCHEMA, VERSION_V2.encode(): SCHEMA_V2}.get(version or b"")
        if expected is None:
            raise RolloutFileError(f"not a {VERSION} or {VERSION_V2} file (metadata intellect.schema missing or different)")
        if not schema.remove_metadata().equals(expected.remove_metadata()):
            raise RolloutFileError(
                f"columns or types differ from {version.decode(errors='replace') if version else ''}: "
                f"got {schema.remove_metadata().to_string()}"
            )
        if parquet.metadata.num_rows > limits.max_rows:
            raise RolloutFileError(f"{parquet.metadata.num_rows} rows, at most {limits.max_rows} allowed")
        _check_declared(data, parquet.metadata, limits)
        # Text columns stay dictionary-encoded until their entries' lengths are checked: one long
        # entry repeated on every row would otherwise expand before any check sees it.
        parquet = pq.ParquetFile(io.BytesIO(data), read_dictionary=list(TEXT_COLUMNS))
        batches, decoded = [], 0
        for batch in parquet.iter_batches(batch_size=64):
            batch = _expanded(batch, expected, limits)
            decoded += batch.nbytes
            if decoded > limits.max_decoded_bytes:
                raise RolloutFileError(f"decompresses to over {limits.max_decoded_bytes} bytes")
            batches.append(batch)
        table = pa.Table.from_batches(batches, schema=expected)
    except RolloutFileError:
        raise
    except Exception as e:  # pyarrow raises many types for corrupt files
        raise RolloutFileError(f"not a readable Parquet file ({type(e).__name__}: {e})") from None
    for name in table.column_names:
        if table.column(name).null_count:
            raise RolloutFileError(f"column {name} has nulls")
    try:
        rows = table.to_pylist()  # pyarrow checks text columns' UTF-8 only here
    except UnicodeDecodeError as e:
        raise RolloutFileError(f"a text column is not valid UTF-8 ({e.reason} at byte {e.start})") from None
    rollouts = [Rollout(**row) for row in rows]
    if not rollouts:
        raise RolloutFileError("the file has no rows")
    for number, r in enumerate(rollouts):
        _check(r, number, limits)
    return rollouts


def _check_declared(data: bytes, metadata: pq.FileMetaData, limits: ReadLimits) -> None:
    """Refuse a file whose page headers declare more values or bytes than ``limits`` allow."""
    try:
        columns = column_pages(data, metadata)
    except PageHeaderError as e:
        raise RolloutFileError(f"unreadable page headers: {e}") from None
    rows = metadata.num_rows
    per_row = {
        "prompt_tokens": limits.max_prompt_tokens,
        "completion_tokens": limits.max_tokens,
        "logprobs": limits.max_tokens,
        "sampled": limits.max_tokens,
    }
    declared = 0
    for column in columns:
        name = column.path.split(".", 1)[0]
        # Dictionary pages repeat at most what the data pages hold, hence the factor 2.
        most = 2 * rows * (per_row.get(name, 0) + 1) + 2
        if column.values > most:
            raise RolloutFileError(f"column {name} declares {column.values} values; {rows} rows allow at most {most}")
        declared += 8 * column.values + column.uncompressed_bytes
    if declared > limits.max_decoded_bytes:
        raise RolloutFileError(f"declares over {limits.max_decoded_bytes} decoded bytes")


def _expanded(batch: pa.RecordBatch, schema: pa.Schema, limits: ReadLimits) -> pa.RecordBatch:
    """``batch`` with its dictionary-encoded text columns expanded, once no entry is too long."""
    longest = dict.fromkeys(TEXT_COLUMNS, ID_CHARS) | {"proofs": proof_bytes(limits.max_tokens)}
    columns = []
    for name in schema.names:
        column = batch.column(name)
        if name in TEXT_COLUMNS:
            lengths = pc.binary_length(column.dictionary)
            if len(lengths) and pc.max(lengths).as_py() > longest[name]:
                raise RolloutFileError(f"column {name} holds a value over {longest[name]} bytes")
            column = column.dictionary_decode()
        columns.append(column)
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def _check(r: Rollout, row: int, limits: ReadLimits) -> None:
    def fail(why: str) -> RolloutFileError:
        return RolloutFileError(f"row {row}: {why}")

    for name, tokens, most in (
        ("prompt_tokens", r.prompt_tokens, limits.max_prompt_tokens),
        ("completion_tokens", r.completion_tokens, limits.max_tokens),
    ):
        if not 1 <= len(tokens) <= most:
            raise fail(f"{name} has {len(tokens)} tokens (1..{most} allowed)")
        if min(tokens) < 0 or max(tokens) >= limits.vocab_size:
            raise fail(f"{name} has a token id outside 0..{limits.vocab_size - 1}")
    if len(r.logprobs) != len(r.completion_tokens):
        raise fail(f"{len(r.logprobs)} logprobs for {len(r.completion_tokens)} completion tokens")
    if r.sampled is not None:
        _check_turns(r, fail, limits)
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
    if len(r.proofs) % 2 or len(r.proofs) > proof_bytes(len(r.completion_tokens)):
        raise fail(f"proofs are {len(r.proofs)} bytes, not a whole number of chunks for this completion")
    if not (r.task_id and r.run_id and r.prompt_id) or max(len(r.task_id), len(r.run_id), len(r.prompt_id)) > ID_CHARS:
        raise fail("task_id, run_id and prompt_id must be 1..128 characters")


def _check_turns(r: Rollout, fail: Callable[[str], RolloutFileError], limits: ReadLimits) -> None:
    """A v2 row's flags: one a token, the model's first, the environment's tokens within the limits and unscored."""
    flags = r.sampled or []
    if len(flags) != len(r.completion_tokens):
        raise fail(f"{len(flags)} sampled flags for {len(r.completion_tokens)} completion tokens")
    if not flags[0]:
        raise fail("the completion starts with the environment's token; the model's turn comes first")
    written = flags.count(False)
    if written > limits.max_environment_tokens:
        raise fail(f"{written} tokens written by the environment; this run allows at most {limits.max_environment_tokens}")
    if r.environment_turns() > limits.max_environment_turns:
        raise fail(f"{r.environment_turns()} environment turns; this run allows at most {limits.max_environment_turns}")
    if any(lp != 0.0 for lp, s in zip(r.logprobs, flags) if not s):
        raise fail("a token the environment wrote carries a logprob; only sampled tokens have one")
