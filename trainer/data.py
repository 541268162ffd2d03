"""Accepted rollouts, from the coordinator's cursor to the groups a policy version trains on.

A group is every sample of one prompt in one task (same prompt, one seed per sample). Groups
are dropped when their policy is older than the async window allows (stale), when the offline
filter's pass-rate range excludes their prompt, or, by INTELLECT-2's online filter, when their
task rewards do not vary (no signal: the length penalty alone would make advantages non-zero).
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from intellect_protocol.shared.rollout_file import ADMITTED, Rollout, read_rollouts
from intellect_protocol.shared.schemas import AcceptedRollouts

if TYPE_CHECKING:  # the learner reads batches without the client's signing stack
    from intellect_protocol.shared.coordinator_client import CoordinatorClient

log = logging.getLogger("intellect.trainer")


@dataclass
class Group:
    key: tuple[str, str]
    """(task id, prompt id)."""
    rollouts: list[Rollout]

    @property
    def policy_step(self) -> int:
        return self.rollouts[0].policy_step

    @property
    def has_signal(self) -> bool:
        return len({r.task_reward for r in self.rollouts}) > 1


@dataclass
class Batch:
    groups: list[Group] = field(default_factory=list)
    cursor: int = 0
    stale: int = 0
    """Groups (or, unread, whole submissions) dropped because their policy was too old."""
    flat: int = 0
    """Groups dropped because their task rewards did not vary."""
    off_range: int = 0
    """Groups dropped by the offline filter: their prompt's dataset pass rate is outside the range."""
    untrained: int = 0
    """Rows left out because their validator named them (a token decided by a disagreement numerics explain)."""
    read_rows: int = 0
    read_task_reward: float = 0.0
    """Rows of the groups read for this batch (stale ones aside), and their task rewards' sum."""


def fetch_accepted(
    api: CoordinatorClient, run_id: str, after: int, oldest_step: int, limit: int = 100, wait_s: float = 0.0
) -> list[tuple[AcceptedRollouts, list[Rollout] | None]]:
    """Accepted submissions after cursor ``after`` (waiting up to ``wait_s`` for the first), with their files (:func:`fetch_files`)."""
    return fetch_files(api, api.accepted(run_id, after, limit, wait_s), oldest_step)


def fetch_files(
    api: CoordinatorClient, entries: list[AcceptedRollouts], oldest_step: int
) -> list[tuple[AcceptedRollouts, list[Rollout] | None]]:
    """The trainable rows of each entry's file; None for those whose policy is older than ``oldest_step``
    (stale ones are only counted, so they are not downloaded)."""
    out: list[tuple[AcceptedRollouts, list[Rollout] | None]] = []
    for entry in entries:
        if entry.policy_step < oldest_step:
            out.append((entry, None))
        else:
            rollouts = read_rollouts(api.accepted_file(entry.submission_id), ADMITTED)
            out.append((entry, [r for i, r in enumerate(rollouts) if i not in set(entry.untrained_rows)]))
    return out


def add_submission(
    batch: Batch,
    rollouts: list[Rollout] | None,
    oldest_step: int,
    keep_prompt: Callable[[str], bool] = lambda _: True,
    online_filter: bool = True,
) -> None:
    """Group ``rollouts`` (None: a stale submission, unread) into ``batch``, counting what is dropped;
    ``online_filter``: drop groups without reward variance (off: they fill the batch at zero advantage)."""
    if rollouts is None:
        batch.stale += 1
        return
    by_prompt: dict[tuple[str, str], list[Rollout]] = defaultdict(list)
    for r in rollouts:
        by_prompt[(r.task_id, r.prompt_id)].append(r)
    for key, members in by_prompt.items():
        group = Group(key, members)
        if group.policy_step < oldest_step:
            batch.stale += 1
            continue
        batch.read_rows += len(members)
        batch.read_task_reward += sum(r.task_reward for r in members)
        if not keep_prompt(key[1]):
            batch.off_range += 1
        elif online_filter and not group.has_signal:
            batch.flat += 1
        else:
            batch.groups.append(group)


class NoSignalWatch:
    """Says once, after ``patience_s`` of reading for one batch, that no group read has a reward spread (the
    online filter drops them all, and the trainer would wait for ever without a word)."""

    def __init__(self, step: int, patience_s: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.step, self.patience_s, self.clock = step, patience_s, clock
        self.started, self.said = clock(), False

    def check(self, batch: Batch) -> None:
        if self.said or batch.groups or not batch.flat or self.clock() - self.started < self.patience_s:
            return
        self.said = True
        log.warning(
            "No learning signal: %d groups read for policy step %d, none with a reward spread (mean task reward %.2f), so "
            "GRPO has nothing to learn from and this trainer cannot step. Use a model that already solves some of the "
            "problems, an easier task, or a reward with partial credit.",
            batch.flat,
            self.step + 1,
            batch.read_task_reward / max(1, batch.read_rows),
        )
