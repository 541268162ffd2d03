"""How accepted submissions become training groups: stale, off-range and flat groups are dropped and counted."""

from __future__ import annotations

import pytest

from shared.rollout_file import Rollout
from trainer.data import Batch, add_submission

pytestmark = pytest.mark.unit


def rollout(prompt: str, step: int, task_reward: float) -> Rollout:
    return Rollout("t1", "r", step, prompt, [1, 2], [3, 2], [-0.1, -0.2], "stop", task_reward, task_reward, 0.0, 0, 7, b"")


def test_groups_are_kept_only_with_a_fresh_policy_an_in_range_prompt_and_a_reward_spread() -> None:
    batch = Batch()
    rates = {"easy": 0.95, "fair": 0.5}
    keep = lambda prompt: rates.get(prompt) is None or 0.1 <= rates[prompt] <= 0.8  # noqa: E731
    add_submission(batch, [rollout("fair", 3, 1.0), rollout("fair", 3, 0.0)], oldest_step=2, keep_prompt=keep)
    add_submission(batch, [rollout("easy", 3, 1.0), rollout("easy", 3, 0.0)], oldest_step=2, keep_prompt=keep)
    add_submission(batch, [rollout("unknown", 3, 1.0), rollout("unknown", 3, 1.0)], oldest_step=2, keep_prompt=keep)
    add_submission(batch, [rollout("fair", 1, 1.0), rollout("fair", 1, 0.0)], oldest_step=2, keep_prompt=keep)
    add_submission(batch, None, oldest_step=2)  # a stale submission counted without being read
    assert [g.key for g in batch.groups] == [("t1", "fair")]
    assert (batch.off_range, batch.flat, batch.stale) == (1, 1, 2)
