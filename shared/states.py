"""The states a run, a task, a submission and an appeal move through in the ledger, and the kinds
of credit entry: one vocabulary for the ledger's columns, the wire schemas and the code.

(A node's status, :class:`~shared.schemas.NodeStatus`, lives with the node schemas.)"""

from __future__ import annotations

import enum


class RunStatus(enum.StrEnum):
    active = "active"
    paused = "paused"
    """Hands out no new tasks; work in flight is still taken and judged."""


class RunKind(enum.StrEnum):
    rl = "rl"
    """Nodes roll out the run's environment; a trainer or trainer islands learn from the accepted work."""
    pretrain = "pretrain"
    """Trainer islands learn from the run's corpus; nodes have no tasks."""


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


class EntryKind(enum.StrEnum):
    credit = "credit"
    """A first acceptance: the trainer reads these, in order."""
    clawback = "clawback"
    """Credit taken back (the work was found invalid or lost on appeal)."""
    restore = "restore"
    """Credit given back after a clawback."""


class ShareState(enum.StrEnum):
    """Where an accepted submission claimed by a trainer island stands (:mod:`shared.island_schemas`)."""

    claimed = "claimed"
    """Handed to an island, which may be training on it."""
    pending = "pending"
    """In the pseudo-gradient an island contributed to an outer step not yet settled."""
    consumed = "consumed"
    """In a published outer step: never handed out again."""


class AuditState(enum.StrEnum):
    """Where the audit of one island's pseudo-gradient in a published pretraining step stands
    (:mod:`coordinator.services.island_audits`)."""

    not_drawn = "not_drawn"
    """Not drawn for a replay: the draw is made once, when the step is settled."""
    awaiting_upload = "awaiting_upload"
    """Drawn; the settling island has not uploaded what was sent yet."""
    open = "open"
    """Uploaded: validators replay it."""
    passed = "passed"
    failed = "failed"
    """Its replay is not what it sent: the island's role is revoked, its slots learnt again."""
    moot = "moot"
    """Not replayed: another audit convicted its island first, and every slot it learnt is learnt again."""
