"""Admin: runs (create, update, pause, resume, evaluations) and their tasks (list, requeue)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import Query
from pydantic import BaseModel, ConfigDict
from sqlalchemy.orm import Session

from intellect_protocol.coordinator.deps import LedgerDep, Settings
from intellect_protocol.coordinator.errors import ApiError
from intellect_protocol.coordinator.models import AdminToken, Run
from intellect_protocol.coordinator.routers.admin.common import CONFLICT, NOT_FOUND, OperateToken, Reader, admin_router, audited
from intellect_protocol.coordinator.services import admin_tokens, runs
from intellect_protocol.shared.environments.length import LengthBudget
from intellect_protocol.shared.run_schemas import BUDGET_FIELDS, EvaluationRequest, RunCreate, RunInfo, RunSettings, RunSpec
from intellect_protocol.shared.schemas import INT32_MAX, ErrorBody, ErrorCode, SamplingParams
from intellect_protocol.shared.states import RunStatus, TaskStatus
from intellect_protocol.shared.tolerances import OPERATOR_CEILING, widening

router = admin_router("runs and tasks")


class TaskOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: str
    run_id: str
    prompt_ids: dict[str, Any]
    seed: int
    policy_step: int
    status: TaskStatus
    leased_to: str | None
    lease_expires_at: datetime | None
    created_at: datetime


def _info(run: Run) -> RunInfo:
    return RunInfo.model_validate(run, from_attributes=True)


def _widening_allowed(body: RunSettings, token: AdminToken) -> dict[str, float]:
    """The audit detail of tolerances wider than the floor; 403 where they pass what ``token``'s scope may set."""
    widened = widening(body.tolerances)
    if widened > OPERATOR_CEILING and not admin_tokens.has_scope(token, "admin"):
        raise ApiError(
            ErrorCode.admin_forbidden,
            f"These tolerances are {widened:.1f}x the shipped model's bounds: past {OPERATOR_CEILING:g}x only an "
            "admin-scope token may set them (forgeries that fit inside them earn credit and reach training).",
        )
    return {"tolerances_widened_by": round(widened, 2)} if body.tolerances is not None else {}


def _stake_needs_a_chain(body: RunSettings, settings: Settings) -> None:
    if body.min_stake and not settings.chain.rpc_url:
        raise ApiError(
            ErrorCode.validation_error,
            "min_stake needs settlement on a chain (INTELLECT_CHAIN_RPC_URL); this coordinator has none.",
        )


def _changes(settings: RunSettings, run: Run | None) -> dict[str, Any]:
    """The set fields of ``settings`` as column values (the length budget is one JSON column)."""
    given = settings.model_dump(exclude_unset=True, exclude=BUDGET_FIELDS)
    if "sampling" in given:
        given["sampling"] = settings.sampling.model_dump() if settings.sampling else SamplingParams().model_dump()
    if settings.audit is not None:
        given["audit"] = settings.audit.model_dump()
    if settings.prompting is not None:
        given["prompting"] = settings.prompting.model_dump(exclude_none=True)
    budget = {"alpha": settings.length_alpha, "target_tokens": settings.target_length, "over_only": settings.length_over_only}
    if any(v is not None for v in budget.values()):
        current = run.length_budget if run is not None else LengthBudget().model_dump()
        given["length_budget"] = LengthBudget(**{**current, **{k: v for k, v in budget.items() if v is not None}}).model_dump()
    return {k: v for k, v in given.items() if v is not None}


@router.get("/runs", response_model=list[RunInfo], dependencies=[Reader])
async def list_runs(ledger: LedgerDep) -> list[RunInfo]:
    return [_info(r) for r in await ledger.run(runs.list_runs)]


@router.post("/runs", response_model=RunInfo, status_code=201, responses={409: {"model": ErrorBody}, 422: {"model": ErrorBody}})
async def create_run(body: RunCreate, ledger: LedgerDep, token: OperateToken, settings: Settings) -> RunInfo:
    """Create an active run; nodes start leasing its tasks at once. Tolerances past 4x the shipped model's
    bounds need an admin-scope token."""
    _stake_needs_a_chain(body, settings)
    widened = _widening_allowed(body, token)

    def work(session: Session) -> RunInfo:
        run = runs.create_run(session, RunSpec.of(body), ledger.now())
        session.flush()
        return _info(run)

    settings_given = body.model_dump(exclude_unset=True, mode="json")
    return await audited(ledger, token, "runs.create", body.name, work, settings=settings_given, **widened)


@router.get("/runs/{run_id}", response_model=RunInfo, dependencies=[Reader], responses=NOT_FOUND)
async def get_run(run_id: str, ledger: LedgerDep) -> RunInfo:
    return _info(await ledger.run(runs.get_run, run_id))


@router.patch("/runs/{run_id}", response_model=RunInfo, responses=NOT_FOUND)
async def update_run(run_id: str, body: RunSettings, ledger: LedgerDep, token: OperateToken, settings: Settings) -> RunInfo:
    """Change a run's settings; tasks already handed out keep the settings they were made with. Tolerances past
    4x the shipped model's bounds need an admin-scope token."""
    _stake_needs_a_chain(body, settings)
    widened = _widening_allowed(body, token)

    def work(session: Session) -> RunInfo:
        return _info(runs.update_run(session, run_id, _changes(body, runs.get_run(session, run_id)), ledger.now()))

    changes = body.model_dump(exclude_unset=True, mode="json")
    return await audited(ledger, token, "runs.update", run_id, work, changes=changes, **widened)


@router.post("/runs/{run_id}/pause", response_model=RunInfo, responses=CONFLICT)
async def pause_run(run_id: str, ledger: LedgerDep, token: OperateToken) -> RunInfo:
    """Stop handing out this run's tasks; work already leased may still be submitted and validated."""
    return await audited(
        ledger, token, "runs.pause", run_id, lambda session: _info(runs.set_status(session, run_id, RunStatus.paused))
    )


@router.post("/runs/{run_id}/resume", response_model=RunInfo, responses=CONFLICT)
async def resume_run(run_id: str, ledger: LedgerDep, token: OperateToken) -> RunInfo:
    """Hand out this run's tasks again."""
    return await audited(
        ledger, token, "runs.resume", run_id, lambda session: _info(runs.set_status(session, run_id, RunStatus.active))
    )


@router.post("/runs/{run_id}/evaluations", status_code=201, responses=NOT_FOUND)
async def post_evaluation(run_id: str, body: EvaluationRequest, ledger: LedgerDep, token: OperateToken) -> dict[str, Any]:
    """Attach an evaluation of a policy step (posting the same step again replaces it); shown on the leaderboard's charts."""

    def work(session: Session) -> dict[str, Any]:
        runs.get_run(session, run_id)
        runs.record_evaluation(session, run_id, body.step, body.metrics, ledger.now())
        return {"run_id": run_id, "step": body.step, **body.metrics}

    return await audited(ledger, token, "runs.evaluate", run_id, work, step=body.step, metrics=body.metrics)


@router.get("/tasks", response_model=list[TaskOut], dependencies=[Reader])
async def list_tasks(
    ledger: LedgerDep,
    run_id: Annotated[str | None, Query(max_length=64)] = None,
    status: TaskStatus | None = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    offset: Annotated[int, Query(ge=0, le=INT32_MAX)] = 0,
) -> list[TaskOut]:
    """Tasks, newest first."""
    return [TaskOut.model_validate(t) for t in await ledger.run(runs.list_tasks, run_id, status, limit, offset)]


@router.post("/tasks/{task_id}/requeue", response_model=TaskOut, responses=CONFLICT)
async def requeue_task(task_id: str, ledger: LedgerDep, token: OperateToken) -> TaskOut:
    """Take a leased task back from its node and offer it to the next one that asks."""

    def work(session: Session) -> TaskOut:
        return TaskOut.model_validate(runs.requeue(session, task_id))

    return await audited(ledger, token, "tasks.requeue", task_id, work)
