"""Runs and the tasks the coordinator hands out for them.

The coordinator picks every task's prompts (a cursor over the environment's problems) and
its seed, so a node cannot choose easy prompts or lucky seeds. A task is leased to one node
until its lease expires; then it returns to the pool for the next node that asks.
"""

from __future__ import annotations

import secrets
import uuid
from datetime import datetime, timedelta
from functools import cache

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from coordinator.errors import ApiError
from coordinator.models import Node, Run, Task
from coordinator.settings import CoordinatorSettings
from shared.environments.length import LengthBudget
from shared.environments.registry import ENVIRONMENTS, get_environment
from shared.schemas import ErrorCode, LeaseRequest, NodeStatus, SamplingParams, TaskSpec


@cache
def problem_ids(environment: str) -> tuple[str, ...]:
    return tuple(p.id for p in get_environment(environment).problems())


def create_run(
    session: Session,
    name: str,
    environment: str,
    model: str,
    sampling: SamplingParams,
    prompts_per_task: int,
    samples_per_prompt: int,
    budget: LengthBudget,
    now: datetime,
    async_level: int = 2,
) -> Run:
    if environment not in ENVIRONMENTS:
        raise ValueError(f"unknown environment {environment!r}; choose one of {', '.join(ENVIRONMENTS)}")
    if session.scalar(select(Run.id).where(Run.name == name)):
        raise ValueError(f"a run named {name!r} exists already")
    run = Run(
        id=f"run-{uuid.uuid4().hex[:12]}",
        name=name,
        environment=environment,
        model=model,
        sampling=sampling.model_dump(),
        prompts_per_task=prompts_per_task,
        samples_per_prompt=samples_per_prompt,
        length_budget=budget.model_dump(),
        policy_step=0,
        next_prompt=0,
        status="active",
        created_at=now,
        async_level=async_level,
    )
    session.add(run)
    return run


def spec(run: Run, task: Task) -> TaskSpec:
    budget = LengthBudget(**run.length_budget)
    return TaskSpec(
        task_id=task.id,
        run_id=run.id,
        environment=run.environment,
        model=run.model,
        prompt_ids=task.prompt_ids["ids"],
        samples_per_prompt=run.samples_per_prompt,
        seed=task.seed,
        policy_step=task.policy_step,
        sampling=SamplingParams(**run.sampling),
        length_alpha=budget.alpha,
        target_length=budget.target_tokens,
        length_over_only=budget.over_only,
        lease_expires_at=task.lease_expires_at,  # type: ignore[arg-type]
    )


def lease(session: Session, signer: str, request: LeaseRequest, settings: CoordinatorSettings, now: datetime) -> TaskSpec | None:
    """A task leased to ``signer``: one it holds but is not working on (it restarted), else an
    open or expired one, else a new one; at most ``max_leases_per_node`` at a time."""
    run_id = request.run_id
    node = session.get(Node, signer)
    if node is None:
        raise ApiError(404, ErrorCode.node_not_registered, "This address has not registered; call /v1/nodes/register first.")
    if node.status == NodeStatus.banned:
        raise ApiError(403, ErrorCode.node_banned, f"This node is banned: {node.ban_reason}", {"reason": node.ban_reason})
    query = select(Run).where(Run.status == "active").order_by(Run.created_at)
    run = session.scalar(query.where(Run.id == run_id) if run_id else query)
    if run is None:
        if run_id:
            raise ApiError(404, ErrorCode.no_run, f"No active run {run_id}.")
        return None

    holding = select(Task).where(Task.status == "leased", Task.leased_to == signer, Task.lease_expires_at > now)
    held = session.scalar(holding.where(Task.run_id == run.id, Task.id.not_in(request.working_on)).limit(1))
    if held is not None:
        return spec(run, held)
    if len(session.scalars(holding).all()) >= settings.max_leases_per_node:
        raise ApiError(
            409, ErrorCode.conflict, f"This node already holds {settings.max_leases_per_node} tasks; submit them first."
        )

    task = session.scalar(
        select(Task)
        .where(Task.run_id == run.id, or_(Task.status == "open", (Task.status == "leased") & (Task.lease_expires_at <= now)))
        .order_by(Task.created_at)
        .limit(1)
        .with_for_update(skip_locked=True)
    )
    if task is None:
        ids = problem_ids(run.environment)
        chosen = [ids[(run.next_prompt + i) % len(ids)] for i in range(run.prompts_per_task)]
        run.next_prompt = (run.next_prompt + run.prompts_per_task) % len(ids)
        task = Task(
            id=f"task-{uuid.uuid4().hex}",
            run_id=run.id,
            prompt_ids={"ids": chosen},
            seed=secrets.randbits(62),
            policy_step=run.policy_step,
            created_at=now,
        )
        session.add(task)
    task.status = "leased"
    task.leased_to = signer
    task.lease_expires_at = now + timedelta(seconds=settings.task_lease_s)
    return spec(run, task)


def policy_steps(session: Session) -> dict[str, int]:
    """The current policy step of every active run."""
    return dict(session.execute(select(Run.id, Run.policy_step).where(Run.status == "active")).all())  # type: ignore[arg-type]
