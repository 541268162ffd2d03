"""The states a run, a task, a submission and an appeal move through in the ledger."""

from __future__ import annotations

import enum


class RunStatus(enum.StrEnum):
    active = "active"
    paused = "paused"
    """Hands out no new tasks; work in flight is still taken and judged."""


class TaskStatus(enum.StrEnum):
    open = "open"
    leased = "leased"
    submitted = "submitted"


class SubmissionStatus(enum.StrEnum):
    pending = "pending"
    """Awaiting its validators' verdicts."""
    accepted = "accepted"
    rejected = "rejected"
    expired = "expired"
    """Stale before it was checked: no credit, no penalty."""
    invalidated = "invalidated"
    """Found invalid by an admin after acceptance."""


class AppealStatus(enum.StrEnum):
    open = "open"
    upheld = "upheld"
    """The rejection stands."""
    overturned = "overturned"
