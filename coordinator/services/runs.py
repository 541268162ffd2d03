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
from typing import Any

from sqlalchemy import delete, func, or_, select
from sqlalchemy.orm import Session

from intellect_protocol.coordinator.errors import ApiError
from intellect_protocol.coordinator.models import Evaluation, Node, PluginFailureReporter, Run, Submission, Task
from intellect_protocol.coordinator.services import admission, nodes
from intellect_protocol.coordinator.settings import CoordinatorSettings
from intellect_protocol.shared.environments.held_out import training
from intellect_protocol.shared.environments.length import LengthBudget
from intellect_protocol.shared.environments.registry import EnvironmentUnavailable, Problem, get_environment, plugin
from intellect_protocol.shared.environments.turns import Rules, rules_of
from intellect_protocol.shared.money import tokens
from intellect_protocol.shared.pretraining.settings import PretrainSettings
from intellect_protocol.shared.prompting import Prompting
from intellect_protocol.shared.rollout_file import shape_error
from intellect_protocol.shared.run_schemas import RunSpec
from intellect_protocol.shared.schemas import ErrorCode, LeaseRequest, NodeStatus, SamplingParams, TaskSpec, WorkWait
from intellect_protocol.shared.states import RunKind, RunStatus, TaskStatus
from intellect_protocol.shared.tolerances import Tolerance

PRETRAINING = "pretraining"
"""What a pretraining run shows as its environment: it has none, and nothing looks this name up as a plugin."""


def episode_rules(run: Run, max_tokens: int) -> Rules | None:
    """The run's episode rules (:mod:`shared.environments.turns`) for tasks of ``max_tokens``; None: single-turn."""
    problems(run.environment, run.environment_version)  # 503, said plainly, where this coordinator lacks the plugin
    return rules_of(get_environment(run.environment, run.environment_version), max_tokens)


@cache
def problems(environment: str, version: str) -> dict[str, Problem]:
    """The problems the run's tasks are drawn from, by id: all but its held-out ones (:mod:`shared.environments.held_out`),
    from exactly the plugin version it pins (503 when this coordinator has another)."""
    try:
        return {p.id: p for p in training(get_environment(environment, version))}
    except EnvironmentUnavailable as e:
        raise ApiError(ErrorCode.environment_unavailable, f"This coordinator cannot serve the run's tasks: {e}.") from None


@cache
def problem_ids(environment: str, version: str) -> tuple[str, ...]:
    return tuple(problems(environment, version))


def create_run(session: Session, spec: RunSpec, now: datetime) -> Run:
    """An active run of ``spec``; an RL run is pinned to the environment plugin installed here. 422 for an
    environment that is not installed or does not load, or tasks too big to submit, 409 for a taken name. A
    pretraining run's shards must be in the blob store already (``intellect-coordinator run create --kind pretrain``
    puts them there)."""
    pretraining = spec.kind == RunKind.pretrain
    environment, version = (PRETRAINING, "") if pretraining else (spec.environment, _pinned(spec.environment))
    if session.scalar(select(Run.id).where(Run.name == spec.name)):
        raise ApiError(ErrorCode.conflict, f"A run named {spec.name!r} exists already.")
    if not pretraining:
        _require_submittable(spec.prompts_per_task, spec.samples_per_prompt, spec.sampling.max_tokens)
    run = Run(
        id=f"run-{uuid.uuid4().hex[:12]}",
        name=spec.name,
        kind=spec.kind,
        corpus=spec.corpus.model_dump() if spec.corpus else None,
        pretrain=(spec.pretrain or PretrainSettings()).model_dump() if pretraining else None,
        environment=environment,
        environment_version=version,
        model=spec.model,
        sampling=spec.sampling.model_dump(),
        prompts_per_task=spec.prompts_per_task,
        samples_per_prompt=spec.samples_per_prompt,
        length_budget=spec.length_budget.model_dump(),
        prompting=spec.prompting.model_dump(exclude_none=True),
        tolerances=_dumped(spec.tolerances),
        tolerances_set_at=now if spec.tolerances else None,
        policy_step=0,
        next_prompt=0,
        status=RunStatus.active,
        created_at=now,
        async_level=spec.async_level,
        dispute_window_s=spec.dispute_window_s,
        audit=spec.audit.model_dump() if spec.audit else None,
        outer=spec.outer.model_dump() if spec.outer else None,
        min_stake=spec.min_stake,
    )
    session.add(run)
    return run


def _pinned(environment: str) -> str:
    """The installed version of ``environment``, which must load; 422 if it does not."""
    try:
        version = plugin(environment).pin
        get_environment(environment, version)
    except EnvironmentUnavailable as e:
        raise ApiError(ErrorCode.validation_error, f"Unusable environment: {e}.") from None
    return version


def task_params(run: Run) -> dict[str, Any]:
    """What a new task pins of its run: later run updates apply to later tasks only."""
    return {
        "model": run.model,
        "sampling": run.sampling,
        "samples_per_prompt": run.samples_per_prompt,
        "length_budget": run.length_budget,
        "prompting": run.prompting,
        "tolerances": run.tolerances,
    }


def params_of(run: Run, task: Task) -> dict[str, Any]:
    return task.params or task_params(run)


def spec(run: Run, task: Task) -> TaskSpec:
    params = params_of(run, task)
    budget = LengthBudget(**params["length_budget"])
    return TaskSpec(
        task_id=task.id,
        run_id=run.id,
        environment=run.environment,
        environment_version=run.environment_version,
        model=params["model"],
        prompt_ids=task.prompt_ids["ids"],
        samples_per_prompt=params["samples_per_prompt"],
        seed=task.seed,
        policy_step=task.policy_step,
        sampling=SamplingParams(**params["sampling"]),
        length_alpha=budget.alpha,
        target_length=budget.target_tokens,
        length_over_only=budget.over_only,
        prompting=Prompting(**(params.get("prompting") or {})),
        tolerances=params.get("tolerances"),
        lease_expires_at=task.lease_expires_at,
    )


def lease(
    session: Session, signer: str, request: LeaseRequest, settings: CoordinatorSettings, now: datetime, stake: int | None = None
) -> TaskSpec | WorkWait:
    """A task leased to ``signer``: one it holds but is not working on (it restarted), else an
    open or expired one, else a new one if the run admits more work now
    (:mod:`coordinator.services.admission`; else why not); never one older than the run's window;
    at most ``max_leases_per_node`` at a time; a run with a minimum stake needs ``stake`` (base units,
    None: unknown) to reach it."""
    run_id = request.run_id
    node = session.get(Node, signer)
    if node is None:
        raise ApiError(ErrorCode.node_not_registered, "This address has not registered; call /v1/nodes/register first.")
    if node.status == NodeStatus.banned:
        raise nodes.banned_error(session, node)
    if run_id:
        run = session.get(Run, run_id)
        if run is None:
            raise ApiError(ErrorCode.no_run, f"No run {run_id}.")
        if run.kind != RunKind.rl:
            # As for an unknown run: a node that names it stops with this sentence rather than asking again.
            raise ApiError(
                ErrorCode.no_run, f"{run_id} is a pretraining run: trainer islands learn it, nodes have no tasks in it."
            )
    else:
        rl = select(Run).where(Run.kind == RunKind.rl)
        active = session.scalar(rl.where(Run.status == RunStatus.active).order_by(Run.created_at).limit(1))
        run = active or session.scalar(rl.order_by(Run.created_at.desc()).limit(1))
        if run is None:
            return admission.NO_RUN
    if run.status != RunStatus.active:
        return admission.paused(run)
    require_run_stake(run, signer, stake)

    # A task older than the run's window would only make rollouts that expire unjudged.
    oldest = run.oldest_step
    holding = select(Task).where(Task.status == TaskStatus.leased, Task.leased_to == signer, Task.lease_expires_at > now)
    held = session.scalar(
        holding.where(Task.run_id == run.id, Task.policy_step >= oldest, Task.id.not_in(request.working_on)).limit(1)
    )
    if held is not None:
        return spec(run, held)
    # Held tasks this run has left behind are dead work: they do not count against the limit.
    alive = holding.where(or_(Task.run_id != run.id, Task.policy_step >= oldest))
    held_files = session.scalar(select(func.count()).where(Submission.address == signer, Submission.held_at.is_not(None))) or 0
    if held_files >= settings.max_leases_per_node:
        message = f"{held_files} of this node's files are held: its validators split and no independent third validator holds the role yet"
        return WorkWait(reason="held", message=message, retry_after_s=60)
    if len(session.scalars(alive).all()) >= settings.max_leases_per_node:
        raise ApiError(ErrorCode.conflict, f"This node already holds {settings.max_leases_per_node} tasks; submit them first.")

    task = session.scalar(
        select(Task)
        .where(Task.run_id == run.id, Task.policy_step >= oldest)
        .where(or_(Task.status == TaskStatus.open, (Task.status == TaskStatus.leased) & (Task.lease_expires_at <= now)))
        .order_by(Task.created_at)
        .limit(1)
        .with_for_update(skip_locked=True)
    )
    if task is None:
        wait = admission.work_wait(session, run, settings, now)
        if wait is not None:
            return wait
        ids = problem_ids(run.environment, run.environment_version)
        chosen = [ids[(run.next_prompt + i) % len(ids)] for i in range(run.prompts_per_task)]
        run.next_prompt = (run.next_prompt + run.prompts_per_task) % len(ids)
        task = Task(
            id=f"task-{uuid.uuid4().hex}",
            run_id=run.id,
            prompt_ids={"ids": chosen},
            seed=secrets.randbits(62),
            policy_step=run.policy_step,
            created_at=now,
            params=task_params(run),
        )
        session.add(task)
    task.status = TaskStatus.leased
    task.leased_to = signer
    task.leased_at = now
    task.lease_expires_at = now + timedelta(seconds=settings.task_lease_s)
    return spec(run, task)


def policy_steps(session: Session) -> dict[str, int]:
    """The current policy step of every active run."""
    return dict(session.execute(select(Run.id, Run.policy_step).where(Run.status == RunStatus.active)).all())


def get_run(session: Session, run_id: str) -> Run:
    run = session.get(Run, run_id)
    if run is None:
        raise ApiError(ErrorCode.not_found, f"No run {run_id}.")
    return run


def _dumped(tolerances: dict[str, Tolerance] | None) -> dict[str, Any] | None:
    return {name: t.model_dump() for name, t in tolerances.items()} if tolerances else None


def list_runs(session: Session) -> list[Run]:
    return list(session.scalars(select(Run).order_by(Run.created_at.desc())))


UPDATABLE = frozenset(
    {
        "model",
        "sampling",
        "prompts_per_task",
        "samples_per_prompt",
        "length_budget",
        "prompting",
        "tolerances",
        "async_level",
        "dispute_window_s",
        "audit",
        "outer",
        "min_stake",
    }
)


def update_run(session: Session, run_id: str, changes: dict[str, Any], now: datetime) -> Run:
    """Apply ``changes`` (keys from :data:`UPDATABLE`); tasks made before keep the settings they were made with."""
    if not set(changes) <= UPDATABLE:
        raise ValueError(f"not settings a running run can change: {sorted(set(changes) - UPDATABLE)}")
    run = get_run(session, run_id)
    for key, value in changes.items():
        setattr(run, key, value)
    if "tolerances" in changes:
        run.tolerances_set_at = now if changes["tolerances"] else None
    _require_submittable(run.prompts_per_task, run.samples_per_prompt, run.sampling["max_tokens"])
    return run


def require_run_stake(run: Run, signer: str, stake: int | None) -> None:
    """403 unless ``signer`` stakes what ``run`` asks of those it hands work (``stake`` None: unreadable, 503)."""
    if run.min_stake:
        require_stake(f"Run {run.name}", signer, run.min_stake, stake)


def require_stake(who_asks: str, signer: str, needed: int, stake: int | None) -> None:
    """403 ``stake_too_low`` unless ``stake`` (None: the registry cannot be read now: 503) reaches ``needed``."""
    if stake is None:
        raise ApiError(
            ErrorCode.chain_unavailable,
            "A stake is needed and the stake registry cannot be read now; try again shortly.",
            headers={"Retry-After": "10"},
        )
    if stake < needed:
        raise ApiError(
            ErrorCode.stake_too_low,
            f"{who_asks} needs {tokens(needed)} tokens staked; {signer} stakes {tokens(stake)}. Stake with `intellect-node stake`.",
            {"needed": str(needed), "staked": str(stake)},
        )


def _require_submittable(prompts_per_task: int, samples_per_prompt: int, max_tokens: int) -> None:
    """Refuse a run whose tasks' rollout files could never be uploaded (422: nothing is created or changed)."""
    why = shape_error(prompts_per_task * samples_per_prompt, max_tokens)
    if why is not None:
        raise ApiError(
            ErrorCode.validation_error,
            f"{prompts_per_task} prompts x {samples_per_prompt} samples of up to {max_tokens} tokens can never be submitted: {why}.",
        )


def set_status(session: Session, run_id: str, status: RunStatus) -> Run:
    """Pause (no new leases; leased work may still be submitted and validated) or resume a run."""
    run = get_run(session, run_id)
    if run.status == status:
        raise ApiError(ErrorCode.conflict, f"Run {run_id} is already {status}.")
    run.status = status
    if status == RunStatus.active:
        run.paused_reason, run.plugin_failures = None, 0
        session.execute(delete(PluginFailureReporter).where(PluginFailureReporter.run_id == run.id))
    return run


def list_tasks(session: Session, run_id: str | None, status: TaskStatus | None, limit: int, offset: int) -> list[Task]:
    query = select(Task).order_by(Task.created_at.desc(), Task.id)
    if run_id is not None:
        query = query.where(Task.run_id == run_id)
    if status is not None:
        query = query.where(Task.status == status)
    return list(session.scalars(query.limit(limit).offset(offset)))


def requeue(session: Session, task_id: str) -> Task:
    """Take a leased task back from its node (e.g. a node known to be gone) and offer it to the next."""
    task = session.get(Task, task_id, with_for_update=True)
    if task is None:
        raise ApiError(ErrorCode.not_found, f"No task {task_id}.")
    if task.status != TaskStatus.leased:
        raise ApiError(ErrorCode.conflict, f"Only leased tasks can be requeued; this one is {task.status}.")
    task.status, task.leased_to, task.lease_expires_at = TaskStatus.open, None, None
    return task


def record_evaluation(session: Session, run_id: str, step: int, metrics: dict[str, float], now: datetime) -> None:
    row = session.scalar(select(Evaluation).where(Evaluation.run_id == run_id, Evaluation.step == step))
    if row is None:
        session.add(Evaluation(run_id=run_id, step=step, metrics=metrics, created_at=now))
    else:
        row.metrics = metrics
