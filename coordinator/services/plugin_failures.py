"""A run's reward code failing on nodes: believed only when it fails here too, counted, and the run paused past a bound.

A node whose copy of the run's reward raises, hangs, runs out of memory or returns no number on a completion
reports the task's problem and the completion's text. Its word is not taken: the coordinator runs the same
pinned reward on the same text, in its own bounded process (:class:`~shared.environments.bounded.BoundedRewards`),
between :func:`reported` and :func:`record`. If the reward scores it here, the failure was the node's own (409,
nothing changes). If it fails here too, the task goes back to the pool, the run counts one more failure, and at
``plugin_failures_to_pause``, reported by at least ``plugin_failure_reporters_to_pause`` nodes, the run is paused
with the coordinator's own sentence as its reason, so a plugin's bug stops the run once, said plainly, instead of
every node in turn. Each report spends one lease (the task must be leased to the reporter, and is given back), so
one node cannot make the coordinator run rewards at will; and since the text is the node's to choose, one node
that found a text the reward crashes on cannot pause the run alone (unless it is the only node there is).
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from intellect_protocol.coordinator import events
from intellect_protocol.coordinator.errors import ApiError
from intellect_protocol.coordinator.models import Node, PluginFailureReporter, Run, Task
from intellect_protocol.coordinator.services.runs import problems
from intellect_protocol.coordinator.services.submissions import require_live_lease
from intellect_protocol.coordinator.settings import CoordinatorSettings
from intellect_protocol.shared.environments.registry import Problem
from intellect_protocol.shared.plugin_schemas import PluginFailureAnswer, PluginFailureReport
from intellect_protocol.shared.schemas import ErrorCode, NodeStatus
from intellect_protocol.shared.states import RunStatus, TaskStatus


def reported(session: Session, signer: str, body: PluginFailureReport, now: datetime) -> tuple[str, str, Problem]:
    """The run's environment, its pin and the problem a node reports its reward failed on (a problem of the task
    ``signer`` holds), to run the reward again here."""
    task = require_live_lease(session.get(Task, body.task_id), body.task_id, signer, now)
    if body.problem_id not in task.prompt_ids["ids"]:
        raise ApiError(ErrorCode.validation_error, f"Problem {body.problem_id!r} is not one of task {task.id}'s.")
    run = session.get_one(Run, task.run_id)
    return run.environment, run.environment_version, problems(run.environment, run.environment_version)[body.problem_id]


def record(
    session: Session, signer: str, body: PluginFailureReport, message: str, settings: CoordinatorSettings, now: datetime
) -> PluginFailureAnswer:
    """The failure, reproduced here: the task back to the pool, one more failure on the run and on its reporter,
    the run paused once both bounds are reached."""
    # Leased still: not given back meanwhile by the same report sent twice.
    task = require_live_lease(session.get(Task, body.task_id, with_for_update=True), body.task_id, signer, now)
    task.status, task.leased_to, task.lease_expires_at = TaskStatus.open, None, None
    run = session.get_one(Run, task.run_id, with_for_update=True)
    run.plugin_failures += 1
    reporter = session.get(PluginFailureReporter, (run.id, signer))
    if reporter is None:
        session.add(reporter := PluginFailureReporter(run_id=run.id, address=signer, failures=0))
    reporter.failures += 1
    session.flush()
    reporters = session.scalar(select(func.count()).where(PluginFailureReporter.run_id == run.id)) or 0
    nodes = session.scalar(select(func.count()).where(Node.status != NodeStatus.banned)) or 0
    needed = max(1, min(settings.plugin_failure_reporters_to_pause, nodes))
    paused = run.status == RunStatus.active and run.plugin_failures >= settings.plugin_failures_to_pause and reporters >= needed
    if paused:
        run.status = RunStatus.paused
        run.paused_reason = (
            f"Paused by the coordinator after {run.plugin_failures} reward failures of its environment on {reporters} "
            f"nodes, each reproduced here; the last: {message}. Fix or pin another release, then resume the run."
        )
        events.after_commit(session, "run %s paused: %s", run.id, run.paused_reason)
    return PluginFailureAnswer(message=message, failures=run.plugin_failures, paused=paused)
