"""Rollout uploads: checked against the lease and the task, stored, recorded as pending."""

from __future__ import annotations

import hashlib
import uuid
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from coordinator.blobs import BlobStore
from coordinator.errors import ApiError
from coordinator.models import Run, Submission, Task
from coordinator.services.runs import params_of
from shared.rollout_file import RolloutFileError, read_rollouts
from shared.schemas import ErrorCode, SubmissionReceipt, sequence_seed


def receipt(submission: Submission) -> SubmissionReceipt:
    return SubmissionReceipt(
        submission_id=submission.id,
        task_id=submission.task_id,
        sha256=submission.sha256,
        rows=submission.rows,
        tokens=submission.tokens,
        status=submission.status,
        created_at=submission.created_at,
    )


def submit(session: Session, signer: str, task_id: str, data: bytes, blobs: BlobStore, now: datetime) -> SubmissionReceipt:
    """Store the rollout file for a task leased to ``signer``; the same file again gets the same receipt."""
    digest = hashlib.sha256(data).hexdigest()
    task = session.get(Task, task_id)
    if task is None:
        raise ApiError(404, ErrorCode.not_found, f"No task {task_id}.")
    existing = session.scalar(select(Submission).where(Submission.task_id == task_id))
    if existing is not None:
        if existing.sha256 == digest and existing.address == signer:
            return receipt(existing)
        raise ApiError(409, ErrorCode.conflict, "A different file was already submitted for this task.")
    if task.leased_to != signer or task.status != "leased":
        raise ApiError(403, ErrorCode.task_not_leased, "This task is not leased to you.")
    if task.lease_expires_at is None or task.lease_expires_at <= now:
        raise ApiError(409, ErrorCode.lease_expired, "The lease on this task expired; lease a new task.")

    run = session.get_one(Run, task.run_id)
    try:
        rollouts = read_rollouts(data)
    except RolloutFileError as e:
        raise ApiError(422, ErrorCode.rollout_invalid, f"The rollout file is invalid: {e}") from None
    samples = params_of(run, task)["samples_per_prompt"]
    expected_prompts = [pid for pid in task.prompt_ids["ids"] for _ in range(samples)]
    if [r.prompt_id for r in rollouts] != expected_prompts:
        raise ApiError(422, ErrorCode.rollout_invalid, f"Rows must be the task's prompts, {samples} samples each, in order.")
    for index, r in enumerate(rollouts):
        if (r.task_id, r.run_id, r.policy_step, r.seed) != (task.id, run.id, task.policy_step, sequence_seed(task.seed, index)):
            raise ApiError(422, ErrorCode.rollout_invalid, f"Row {index} names another task, run, policy step or seed.")

    key = f"{run.id}/{task.id}/{digest}.parquet"
    blobs.put(key, data)
    submission = Submission(
        id=f"sub-{uuid.uuid4().hex}",
        task_id=task.id,
        run_id=run.id,
        address=signer,
        sha256=digest,
        blob_key=key,
        rows=len(rollouts),
        tokens=sum(len(r.completion_tokens) for r in rollouts),
        prompt_tokens=sum(len(r.prompt_tokens) for r in rollouts),
        status="pending",
        created_at=now,
    )
    session.add(submission)
    task.status = "submitted"
    return receipt(submission)
