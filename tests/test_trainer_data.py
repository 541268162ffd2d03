"""How accepted submissions become training groups: stale, off-range and flat groups are dropped and counted."""

from __future__ import annotations

import pytest

from intellect_protocol.shared.rollout_file import Rollout
from intellect_protocol.trainer.data import Batch, add_submission

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


def test_without_the_online_filter_flat_groups_fill_the_batch() -> None:
    filtered, unfiltered = Batch(), Batch()
    flat, spread = [rollout("a", 3, 1.0), rollout("a", 3, 1.0)], [rollout("b", 3, 1.0), rollout("b", 3, 0.0)]
    for rollouts in (flat, spread):
        add_submission(filtered, rollouts, oldest_step=2)
        add_submission(unfiltered, rollouts, oldest_step=2, online_filter=False)
    assert [g.key[1] for g in filtered.groups] == ["b"] and filtered.flat == 1
    assert [g.key[1] for g in unfiltered.groups] == ["a", "b"] and unfiltered.flat == 0
    # Stale work is dropped either way: the window is a protocol rule, not a filter.
    add_submission(unfiltered, [rollout("c", 1, 1.0), rollout("c", 1, 0.0)], oldest_step=2, online_filter=False)
    assert unfiltered.stale == 1 and len(unfiltered.groups) == 2
