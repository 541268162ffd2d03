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
