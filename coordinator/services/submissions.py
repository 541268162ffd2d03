"""Rollout uploads: checked against the lease and the task, stored, recorded as pending.

An upload passes through four steps so that nothing large happens on the event loop or inside
a transaction: what the task allows is read (:func:`expected_file`), the file is parsed within
that on a thread (:func:`parse`), the blob is written, and only then is it recorded in one short
transaction that checks the lease again (:func:`record`). A blob whose record then fails is
an orphan under a content-addressed key, never a ledger row without its file."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import NamedTuple

from sqlalchemy import select
from sqlalchemy.orm import Session

from intellect_protocol.coordinator.errors import ApiError
from intellect_protocol.coordinator.models import Node, Nonce, Run, Submission, Task
from intellect_protocol.coordinator.services import committee, learning_signal, nodes, staleness
from intellect_protocol.coordinator.services.runs import episode_rules, params_of
from intellect_protocol.shared.rollout_file import ReadLimits, Rollout, RolloutFileError, read_rollouts
from intellect_protocol.shared.schemas import ErrorCode, NodeStatus, SubmissionReceipt, checksum_address, sequence_seed
from intellect_protocol.shared.states import SubmissionStatus, TaskStatus


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


@dataclass(frozen=True)
class ExpectedFile:
    limits: ReadLimits
    """What the file may hold."""
    blob_key: str
    """Where it is stored."""
    rows: list[tuple[str, str, str, int, int]]
    """Each row's (prompt id, task id, run id, policy step, seed)."""
    samples: int


class Admitted(NamedTuple):
    retry: bool
    """The signer submitted this task already: the upload is answered with the same receipt."""
    newcomer: bool
    """The signer has no accepted file yet."""


def admit_upload(session: Session, claimed: str, nonce: str, task_id: str, now: datetime) -> Admitted:
    """Refuse, from its headers alone (their signature checked already, over the body's declared hash),
    an upload that could never be recorded, before a byte of its body is staged: the signer must be a
    registered node that is not banned and hold a live lease on ``task_id`` (or have submitted it: a
    retry, answered with the same receipt), and the nonce must be new."""
    try:
        node = session.get(Node, checksum_address(claimed))
    except ValueError:
        node = None
    if node is None:
        raise ApiError(ErrorCode.node_not_registered, "The claimed signer is not a registered node; nothing was read.")
    if node.status == NodeStatus.banned:
        raise nodes.banned_error(session, node)
    if session.scalar(select(Nonce.id).where(Nonce.address == node.address, Nonce.nonce == nonce)) is not None:
        raise ApiError(ErrorCode.nonce_reused, "This request's nonce was already used; sign a fresh request.")
    accepted = select(Submission.id).where(Submission.address == node.address, Submission.status == SubmissionStatus.accepted)
    newcomer = session.scalar(accepted.limit(1)) is None
    if session.scalar(select(Submission.id).where(Submission.task_id == task_id, Submission.address == node.address)) is not None:
        return Admitted(retry=True, newcomer=newcomer)
    require_live_lease(session.get(Task, task_id), task_id, node.address, now)
    return Admitted(retry=False, newcomer=newcomer)


def require_live_lease(task: Task | None, task_id: str, address: str, now: datetime) -> Task:
    """``task``, if it is leased to ``address`` and its lease is running; else 404 or 409."""
    if task is None:
        raise ApiError(ErrorCode.not_found, f"No task {task_id}.")
    if task.leased_to != address or task.status != TaskStatus.leased:
        raise ApiError(ErrorCode.task_not_leased, "This task is not leased to you.")
    if task.lease_expires_at is None or task.lease_expires_at <= now:
        raise ApiError(ErrorCode.lease_expired, "The lease on this task expired; lease a new task.")
    return task


def expected_file(session: Session, signer: str, task_id: str, digest: str, now: datetime) -> ExpectedFile | None:
    """What the file for a task leased to ``signer`` may hold; None when this very file is stored already.

    Read before the upload is parsed, so a file is decoded only within what its task can hold."""
    task = session.get(Task, task_id)
    if task is None:
        raise ApiError(ErrorCode.not_found, f"No task {task_id}.")
    existing = session.scalar(select(Submission).where(Submission.task_id == task_id))
    if existing is not None:
        if existing.sha256 == digest and existing.address == signer:
            return None
        raise ApiError(ErrorCode.conflict, "A different file was already submitted for this task.")
    require_live_lease(task, task_id, signer, now)
    params = params_of(session.get_one(Run, task.run_id), task)
    samples = params["samples_per_prompt"]
    prompts = [pid for pid in task.prompt_ids["ids"] for _ in range(samples)]
    rows = [(pid, task.id, task.run_id, task.policy_step, sequence_seed(task.seed, i)) for i, pid in enumerate(prompts)]
    rules = episode_rules(session.get_one(Run, task.run_id), params["sampling"]["max_tokens"])
    limits = ReadLimits.for_task(
        len(rows),
        params["sampling"]["max_tokens"],
        rules.environment_tokens if rules else 0,
        rules.max_turns if rules else 0,
    )
    return ExpectedFile(limits, f"{task.run_id}/{task.id}/{digest}.parquet", rows, samples)


def parse(data: bytes, expected: ExpectedFile) -> list[Rollout]:
    """The upload's rows, if they are its task's (call off the event loop: this decodes up to the task's limits)."""
    try:
        rollouts = read_rollouts(data, expected.limits)
    except RolloutFileError as e:
        raise ApiError(ErrorCode.rollout_invalid, f"The rollout file is invalid: {e}") from None
    if [r.prompt_id for r in rollouts] != [row[0] for row in expected.rows]:
        raise ApiError(ErrorCode.rollout_invalid, f"Rows must be the task's prompts, {expected.samples} samples each, in order.")
    for index, (r, row) in enumerate(zip(rollouts, expected.rows)):
        if (r.prompt_id, r.task_id, r.run_id, r.policy_step, r.seed) != row:
            raise ApiError(ErrorCode.rollout_invalid, f"Row {index} names another task, run, policy step or seed.")
    return rollouts


def record(
    session: Session,
    signer: str,
    task_id: str,
    digest: str,
    rollouts: list[Rollout] | None,
    now: datetime,
    upload_started_at: datetime | None = None,
) -> SubmissionReceipt:
    """Record a stored file, parsed by :func:`parse`, for a task leased to ``signer`` (the lease is
    checked again: it may have ended meanwhile); the same file again gets the same receipt.
    ``upload_started_at``: when its upload began (default ``now``)."""
    expected = expected_file(session, signer, task_id, digest, now)
    if expected is None or rollouts is None:
        existing = session.scalar(select(Submission).where(Submission.task_id == task_id))
        if existing is None:
            raise ApiError(ErrorCode.conflict, "The task changed while its file was uploaded; upload it again.")
        return receipt(existing)
    task = session.get_one(Task, task_id)
    submission = Submission(
        id=f"sub-{uuid.uuid4().hex}",
        task_id=task.id,
        run_id=task.run_id,
        address=signer,
        sha256=digest,
        blob_key=expected.blob_key,
        rows=len(rollouts),
        tokens=sum(len(r.completion_tokens) for r in rollouts),
        prompt_tokens=sum(len(r.prompt_tokens) for r in rollouts),
        **learning_signal.file_signal(rollouts),
        status=SubmissionStatus.pending,
        created_at=now,
        upload_started_at=upload_started_at or now,
    )
    session.add(submission)
    session.flush()
    task.status = TaskStatus.submitted
    if staleness.stale(session, submission):  # it went stale while being made: no validator need look
        staleness.expire(session, submission, now)
    else:
        committee.open_review(session, submission, "first", now)
    return receipt(submission)
