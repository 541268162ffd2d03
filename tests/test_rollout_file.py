"""The rollout file: round trip, and a clean refusal for every malformed or hostile file."""

from __future__ import annotations

import io
from dataclasses import replace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.rollout_file import SCHEMA, ReadLimits, Rollout, RolloutFileError, read_rollouts, write_rollouts


def rollout(**changes: object) -> Rollout:
    base = Rollout(
        task_id="t1", run_id="r1", policy_step=3, prompt_id="a17",
        prompt_tokens=[1, 4, 5, 6], completion_tokens=[7, 8, 2], logprobs=[-0.1, -2.0, -0.5],
        finish_reason="stop", reward=0.9, task_reward=1.0, length_penalty=0.1, target_length=40, seed=12,
        proofs=b"\x00" * 258,
    )  # fmt: skip
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
    with pytest.raises(RolloutFileError, match="decompresses to over"):
        read_rollouts(data, ReadLimits(max_decoded_bytes=1 << 20))  # ...but would decode to about 5 MB
    assert len(read_rollouts(data)) == 8
