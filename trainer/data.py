"""Accepted rollouts, from the coordinator's cursor to the groups a policy version trains on.

A group is every sample of one prompt in one task (same prompt, one seed per sample). Groups
are dropped when their policy is older than the async window allows (stale) or when their
task rewards do not vary (no signal: the length penalty alone would make advantages non-zero).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import httpx

from shared.rollout_file import Rollout, read_rollouts
from shared.schemas import AcceptedRollouts


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
    """Groups dropped because their policy was too old."""
    flat: int = 0
    """Groups dropped because their task rewards did not vary."""


def fetch_accepted(http: httpx.Client, run_id: str, after: int, limit: int = 100) -> list[tuple[AcceptedRollouts, list[Rollout]]]:
    reply = http.get("/v1/trainer/rollouts", params={"run": run_id, "after": after, "limit": limit})
    reply.raise_for_status()
    out = []
    for entry in (AcceptedRollouts.model_validate(e) for e in reply.json()):
        data = http.get(f"/v1/trainer/submissions/{entry.submission_id}/file")
        data.raise_for_status()
        out.append((entry, read_rollouts(data.content)))
    return out


def add_submission(batch: Batch, rollouts: list[Rollout], oldest_step: int) -> None:
    by_prompt: dict[tuple[str, str], list[Rollout]] = defaultdict(list)
    for r in rollouts:
        by_prompt[(r.task_id, r.prompt_id)].append(r)
    for key, members in by_prompt.items():
        group = Group(key, members)
        if group.policy_step < oldest_step:
            batch.stale += 1
        elif not group.has_signal:
            batch.flat += 1
        else:
            batch.groups.append(group)
