"""What a node says when the run's reward code fails on its work, and what the coordinator answers."""

from __future__ import annotations

from pydantic import BaseModel, Field

from intellect_protocol.shared.schemas import Address, Request

MAX_COMPLETION_CHARS = 1 << 18
"""Longest completion text a report carries (far past any run's ``max_tokens`` in characters)."""


class PluginFailureReport(Request):
    """The run's reward failed (raised, hung, ran out of memory or gave no number) on one completion of a task the
    node holds: the coordinator runs the same reward on the same text, and takes the task back if it fails there too."""

    address: Address
    task_id: str = Field(max_length=64)
    problem_id: str = Field(max_length=256)
    completion: str = Field(max_length=MAX_COMPLETION_CHARS)
    """The completion's text, as the reward was given it."""


class PluginFailureAnswer(BaseModel):
    """A failure the coordinator reproduced: the task is back in the pool, and the failure counts against the run."""

    message: str
    """The coordinator's own sentence for the failure (plugin ``package==version``, problem, what went wrong)."""
    failures: int
    """The run's reproduced failures so far."""
    paused: bool
    """Whether this failure paused the run."""
