"""The rollout file: round trip, and a clean refusal for every malformed or hostile file."""

from __future__ import annotations

import io
import resource
import time
from dataclasses import fields, replace

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from intellect_protocol.shared.rollout_file import (
    SCHEMA,
    ReadLimits,
    Rollout,
    RolloutFileError,
    read_rollouts,
    shape_error,
    write_rollouts,
)

pytestmark = pytest.mark.unit


def rollout(**changes: object) -> Rollout:
    base = Rollout(
        task_id="t1",
        run_id="r1",
        policy_step=3,
        prompt_id="a17",
        prompt_tokens=[1, 4, 5, 6],
        completion_tokens=[7, 8, 2],
        logprobs=[-0.1, -2.0, -0.5],
        finish_reason="stop",
        reward=0.9,
        task_reward=1.0,
        length_penalty=0.1,
        target_length=40,
        seed=12,
        proofs=b"\x00" * 258,
    )
    return replace(base, **changes)


def test_round_trip() -> None:
    rows = [rollout(), rollout(prompt_id="a18", seed=13, finish_reason="length")]
    back = read_rollouts(write_rollouts(rows))
    assert [r.prompt_id for r in back] == ["a17", "a18"]
    assert back[0].logprobs == pytest.approx(rows[0].logprobs)
    assert back[0].proofs == rows[0].proofs and back[1].finish_reason == "length"


@pytest.mark.parametrize(
    "bad,message",
    [
        (rollout(logprobs=[-0.1]), "logprobs for"),
        (rollout(logprobs=[-0.1, float("nan"), -0.5]), "finite"),
        (rollout(logprobs=[-0.1, 0.5, -0.5]), "<= 0"),
        (rollout(completion_tokens=[7, -1, 2]), "token id"),
        (rollout(prompt_tokens=[]), "prompt_tokens has 0"),
        (rollout(finish_reason="abort"), "finish_reason"),
        (rollout(reward=float("inf")), "not finite"),
        (rollout(reward=5.0), "task_reward - length_penalty"),
        (rollout(policy_step=-1), ">= 0"),
        (rollout(proofs=b"\x00" * 259), "proofs"),
        (rollout(proofs=b"\x00" * 258 * 5), "proofs"),
        (rollout(task_id=""), "task_id"),
    ],
)
def test_bad_values_are_refused(bad: Rollout, message: str) -> None:
    with pytest.raises(RolloutFileError, match=message):
        read_rollouts(write_rollouts([rollout(), bad]))


def test_limits() -> None:
    data = write_rollouts([rollout()] * 3)
    with pytest.raises(RolloutFileError, match="3 rows"):
        read_rollouts(data, ReadLimits(max_rows=2))
    with pytest.raises(RolloutFileError, match="token id"):
        read_rollouts(data, ReadLimits(vocab_size=8))
    with pytest.raises(RolloutFileError, match="no rows"):
        read_rollouts(write_rollouts([]))


def _parquet(table: pa.Table) -> bytes:
    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    return buffer.getvalue()


def test_wrong_schema_is_refused() -> None:
    good = pa.Table.from_pylist([vars(rollout())], schema=SCHEMA)
    with pytest.raises(RolloutFileError, match="metadata"):
        read_rollouts(_parquet(good.replace_schema_metadata({})))
    with pytest.raises(RolloutFileError, match="metadata"):
        read_rollouts(_parquet(good.replace_schema_metadata({"intellect.schema": "rollout-v0"})))
    wrong_type = good.set_column(2, "policy_step", pa.array(["3"])).replace_schema_metadata(SCHEMA.metadata)
    with pytest.raises(RolloutFileError, match="columns or types"):
        read_rollouts(_parquet(wrong_type))
    extra = good.append_column("text", pa.array(["hello"])).replace_schema_metadata(SCHEMA.metadata)
    with pytest.raises(RolloutFileError, match="columns or types"):
        read_rollouts(_parquet(extra))
    nulls = pa.Table.from_pylist([{**vars(rollout()), "seed": None}], schema=SCHEMA)
    with pytest.raises(RolloutFileError, match="nulls"):
        read_rollouts(_parquet(nulls))


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=4096))
def test_arbitrary_bytes_never_crash(data: bytes) -> None:
    with pytest.raises(RolloutFileError):
        read_rollouts(data)


def test_text_that_is_not_utf8_is_refused() -> None:
    # Found by the test below: pyarrow reads invalid UTF-8 into a text column and fails only on conversion.
    data = write_rollouts([rollout(prompt_id="zq9")])
    assert data.count(b"zq9") >= 1
    with pytest.raises(RolloutFileError, match="not valid UTF-8"):
        read_rollouts(data.replace(b"zq9", b"\x80q9"))


@settings(max_examples=100, deadline=None)
@given(st.integers(min_value=0, max_value=2000), st.binary(min_size=1, max_size=8))
def test_corrupted_files_never_crash(position: int, garbage: bytes) -> None:
    data = bytearray(write_rollouts([rollout()]))
    position %= len(data)
    data[position : position + len(garbage)] = garbage
    try:
        read_rollouts(bytes(data))
    except RolloutFileError:
        pass


_VALUES = {
    pa.int64(): st.integers(min_value=-(2**63), max_value=2**63 - 1),
    pa.int32(): st.integers(min_value=-(2**31), max_value=2**31 - 1),
    pa.float64(): st.floats(allow_nan=True, allow_infinity=True),
    pa.float32(): st.floats(width=32, allow_nan=True, allow_infinity=True),
    pa.string(): st.text(max_size=20),
    pa.binary(): st.binary(max_size=600),
}


def _value(kind: pa.DataType) -> st.SearchStrategy:
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return st.lists(_value(kind.value_type), max_size=40)
    return _VALUES.get(kind, st.none())


@st.composite
def hostile_tables(draw: st.DrawFn) -> pa.Table:
    """Tables in the rollout schema with any values its types allow (NaN, inf, negative, huge,
    empty, mismatched lengths), or with a column's type swapped for another."""
    schema = SCHEMA
    if draw(st.booleans()):
        index = draw(st.integers(0, len(schema) - 1))
        other = draw(st.sampled_from([pa.int32(), pa.float32(), pa.string(), pa.list_(pa.float64()), pa.binary()]))
        schema = schema.set(index, pa.field(schema.field(index).name, other))
    rows = draw(st.integers(1, 4))
    columns = {f.name: [draw(_value(f.type)) for _ in range(rows)] for f in schema}
    return pa.Table.from_pydict(columns, schema=schema.with_metadata(SCHEMA.metadata))  # past the version check


@settings(max_examples=150, deadline=None)
@given(hostile_tables())
def test_hostile_values_and_types_are_refused_cleanly(table: pa.Table) -> None:
    try:
        rollouts = read_rollouts(_parquet(table))
    except RolloutFileError:
        return
    for r in rollouts:  # the rare table that passes must hold only sane values
        assert r.prompt_tokens and r.completion_tokens and len(r.logprobs) == len(r.completion_tokens)
        assert all(x <= 0 and x == x for x in r.logprobs) and r.policy_step >= 0


def test_a_decompression_bomb_is_refused_before_it_is_read() -> None:
    big = rollout(completion_tokens=[3] * 100_000, logprobs=[-0.5] * 100_000)
    data = write_rollouts([big] * 8)
    assert len(data) < 200_000  # compresses well...
    with pytest.raises(RolloutFileError, match="declares over"):
        read_rollouts(data, ReadLimits(max_decoded_bytes=1 << 20))  # ...but would decode to about 5 MB
    assert len(read_rollouts(data)) == 8


def _zero_tokens_file(tokens: int) -> bytes:
    """One row whose completion is ``tokens`` zeros: a few KB of Parquet, ``4 * tokens`` bytes decoded."""
    columns = {f.name: pa.array([getattr(rollout(), f.name)], f.type) for f in SCHEMA}
    columns["completion_tokens"] = pa.ListArray.from_arrays(
        pa.array([0, tokens], pa.int32()), pa.array(np.zeros(tokens, np.int32))
    )
    buffer = io.BytesIO()
    pq.write_table(pa.table(columns, schema=SCHEMA), buffer, compression="zstd")
    return buffer.getvalue()


def _varint(n: int) -> bytes:
    out = b""
    while True:
        byte, n = n & 0x7F, n >> 7
        if not n:
            return out + bytes([byte])
        out += bytes([byte | 0x80])


def test_a_token_bomb_is_refused_from_its_page_headers_even_when_the_footer_lies() -> None:
    tokens = 20_000_000
    data = _zero_tokens_file(tokens)
    assert len(data) < 10_000
    # The footer's num_values for the completion column (a zigzag varint) rewritten to 5, padded to
    # the same length: pyarrow would still decode every value the page header declares.
    honest = _varint(2 * tokens)
    footer = len(data) - 8 - int.from_bytes(data[-8:-4], "little")
    at = data.index(honest, footer)
    lie = bytes([_varint(10)[0] | 0x80]) + b"\x80" * (len(honest) - 2) + b"\x00"
    lying = data[:at] + lie + data[at + len(honest) :]
    assert 5 in [pq.ParquetFile(io.BytesIO(lying)).metadata.row_group(0).column(i).num_values for i in range(len(SCHEMA))]

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for bomb in (data, lying):
        started = time.monotonic()
        with pytest.raises(RolloutFileError, match="completion_tokens declares 20000001 values"):
            read_rollouts(bomb)
        assert time.monotonic() - started < 0.5
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak < 50_000  # KiB: nothing was decoded


def test_a_long_text_entry_repeated_on_every_row_is_refused_before_it_expands() -> None:
    rows = [rollout(prompt_id="p" * 100_000) for _ in range(64)]  # 6.4 MB of ids from one dictionary entry
    columns = {f.name: [getattr(r, f.name) for r in rows] for f in fields(Rollout)}
    buffer = io.BytesIO()
    pq.write_table(pa.Table.from_pydict(columns, schema=SCHEMA), buffer, compression="zstd")
    with pytest.raises(RolloutFileError, match="prompt_id holds a value over 128 bytes"):
        read_rollouts(buffer.getvalue())


def test_task_limits_bound_a_file_to_what_its_task_can_hold() -> None:
    data = write_rollouts([rollout(), rollout()])
    assert len(read_rollouts(data, ReadLimits.for_task(rows=2, max_tokens=3))) == 2
    with pytest.raises(RolloutFileError, match="2 rows, at most 1"):
        read_rollouts(data, ReadLimits.for_task(rows=1, max_tokens=3))
    with pytest.raises(RolloutFileError, match="completion_tokens has 3 tokens"):
        read_rollouts(data, ReadLimits.for_task(rows=2, max_tokens=2))


def test_impossible_task_shapes_are_named() -> None:
    assert shape_error(rows=64, max_tokens=1024) is None
    assert "at most 4096" in (shape_error(rows=1024 * 256, max_tokens=128) or "")
    assert "exceed" in (shape_error(rows=8, max_tokens=1 << 18) or "")
    assert "MiB" in (shape_error(rows=4096, max_tokens=1 << 16) or "")


def episode(**changes: object) -> Rollout:
    """A multi-turn row: the model's call, the tool's result, the model's answer."""
    turns: dict[str, object] = {
        "completion_tokens": [7, 8, 30, 31, 9, 2],
        "logprobs": [-0.1, -0.2, 0.0, 0.0, -0.3, -0.1],
        "sampled": [True, True, False, False, True, True],
    }
    return rollout(**(turns | changes))


EPISODE_LIMITS = ReadLimits(max_environment_tokens=2, max_environment_turns=1)


def test_a_multi_turn_file_is_version_2_and_says_who_wrote_each_token() -> None:
    data = write_rollouts([episode(), rollout(prompt_id="a18")])
    assert pq.ParquetFile(io.BytesIO(data)).schema_arrow.metadata[b"intellect.schema"] == b"rollout-v2"
    first, second = read_rollouts(data, EPISODE_LIMITS)
    assert first.sampled == [True, True, False, False, True, True] and first.environment_turns() == 1
    assert second.sampled == [True] * 3  # a single-turn row of a v2 file: every token the model's
    # Every token sampled: the file is version 1, as single-turn work always was.
    single = write_rollouts([rollout(sampled=[True, True, True])])
    assert pq.ParquetFile(io.BytesIO(single)).schema_arrow.metadata[b"intellect.schema"] == b"rollout-v1"
    assert read_rollouts(single)[0].sampled is None


@pytest.mark.parametrize(
    "bad,message",
    [
        (episode(sampled=[True, False]), "2 sampled flags for 6 completion tokens"),
        (episode(sampled=[False, True, False, False, True, True]), "starts with the environment's token"),
        (
            episode(sampled=[True, False, False, False, True, True]),
            "3 tokens written by the environment; this run allows at most 2",
        ),
        (episode(sampled=[True, False, True, False, True, True]), "2 environment turns; this run allows at most 1"),
        (episode(logprobs=[-0.1, -0.2, -1.5, 0.0, -0.3, -0.1]), "a token the environment wrote carries a logprob"),
    ],
)
def test_bad_turns_are_refused(bad: Rollout, message: str) -> None:
    with pytest.raises(RolloutFileError, match=message):
        read_rollouts(write_rollouts([bad]), EPISODE_LIMITS)


def test_a_single_turn_task_refuses_tokens_labelled_as_the_environments() -> None:
    """A node relabelling its own sampled tokens as the environment's (to dodge the sampling check) is refused
    where the run has no environment turns: the default limits, and every single-turn task's."""
    data = write_rollouts([episode()])
    for limits in (ReadLimits(), ReadLimits.for_task(1, 64)):
        with pytest.raises(RolloutFileError, match="2 tokens written by the environment; this run allows at most 0"):
            read_rollouts(data, limits)
    assert read_rollouts(data, ReadLimits.for_task(1, 64, environment_tokens=2, environment_turns=1))[0].sampled
