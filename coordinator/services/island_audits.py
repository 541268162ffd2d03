"""Audits of pretraining islands: validators replay a drawn share of the pseudo-gradients published steps averaged.

The islands of a meeting vouch for the step's record (:mod:`coordinator.services.step_vouches`), and in a pretraining
run that record holds the sha256 of every pseudo-gradient the average included, as every island received it
(:class:`shared.island_schemas.Included`). So the island that sent one cannot deny it, and nobody can frame it.

- :func:`draw`: when a step is settled, each included pseudo-gradient is drawn for audit with the run's
  ``audit_rate``, once, from the coordinator's randomness: after the island sent it, so it cannot know which of its
  steps will be replayed. The settling island is asked to upload the drawn ones (and, for an overlapped round, the
  island's pseudo-gradient it started from). :func:`require_settled` keeps a publisher from skipping the settling.
- :func:`admit_upload` and :func:`record_upload`: a trainer of the run uploads the bytes of a drawn one; stored only
  if their sha256 is the digest the step's record holds.
- :func:`open_audits` and :func:`vote`: each audit is drawn for a validator at random, and only that one may judge it
  (a lone pass is checked by a second one at the run's ``audit_second_opinion``); validators replay it
  (:func:`shared.pretraining.audit.replay`) from the step's starting weights on the slots the island reported, in the
  order it reported them, and send how far what it sent is from the replay. The coordinator judges that against the run's ``audit_tolerance``; at least ``audit_votes``
  verdicts decide the audit (:func:`decided`): all passing, or a majority of at least two. So one validator alone
  never convicts an island, and a split waits for another validator's replay.
- :func:`convict`: a failed audit revokes the island's trainer role, citing the audit (its stake is slashed once the
  dispute window passes: :func:`coordinator.services.settlement.slashes_due`), and every slot it holds or learnt
  goes back to the pool to be learnt again.
"""

from __future__ import annotations

import random
from datetime import datetime, timedelta

from sqlalchemy import delete, func, select, update
from sqlalchemy.orm import Session, aliased

from intellect_protocol.coordinator import events
from intellect_protocol.coordinator.errors import ApiError
from intellect_protocol.coordinator.island_models import Island, IslandAudit, IslandAuditVote, IslandShare
from intellect_protocol.coordinator.models import Role, Run
from intellect_protocol.coordinator.services import accountability, pretraining, roles
from intellect_protocol.coordinator.settings import CoordinatorSettings
from intellect_protocol.coordinator.shardcast_models import PolicyManifest
from intellect_protocol.shared.island_audit_schemas import IslandAuditInfo, IslandAuditTask, IslandAuditVerdict
from intellect_protocol.shared.island_schemas import IslandSettle, OuterSettings
from intellect_protocol.shared.schemas import ErrorCode, RoleName
from intellect_protocol.shared.states import AuditState, RunKind, RunStatus, ShareState

AUDIT_FAILED = "failed the audit of"
"""How a trainer's revocation for a failed audit begins: such a trainer is slashed once the dispute window passed."""
_draws = random.SystemRandom()
DRAWS_PER_CALL = 100
"""Open audits looked at for drawing at one validator's call (the oldest first)."""


def blob_key(run_id: str, digest: str) -> str:
    return f"pseudo-gradients/{run_id}/{digest}.bf16"


def require_digests(run: Run, body: IslandSettle) -> None:
    """409 unless, in a pretraining run that audits its outer steps, the settled step's record names the sha256 of
    every pseudo-gradient it included: without one, that island's step could never be drawn. Every island of an
    audited run records them (one of several FSDP ranks gathers each whole first); a record without is no honest
    island's."""
    missing = [i.island for i in body.included if i.digest is None]
    if missing and run.kind == RunKind.pretrain and pretraining.corpus_of(run)[1].audit_rate > 0:
        raise ApiError(
            ErrorCode.conflict,
            f"{run.id} audits its islands' outer steps, and the record of outer step {body.outer_step} names no sha256 "
            f"for the pseudo-gradient of {', '.join(missing[:3])}: every island of an audited run records them.",
        )


def draw(session: Session, run: Run, body: IslandSettle, now: datetime) -> list[str]:
    """Draw the audits of settled outer step ``body.outer_step`` (once: a repeated settling draws nothing new); the
    digests of its drawn pseudo-gradients, and of those they started from, not uploaded yet."""
    _, settings = pretraining.corpus_of(run)
    for included in body.included:
        of_step = (IslandAudit.run_id == run.id, IslandAudit.outer_step == body.outer_step, IslandAudit.island == included.island)
        if included.digest is None or session.scalar(select(IslandAudit.id).where(*of_step)) is not None:
            continue
        island = session.get_one(Island, (run.id, included.island))
        drawn = _draws.random() < settings.audit_rate
        audit = IslandAudit(
            run_id=run.id,
            outer_step=body.outer_step,
            island=included.island,
            address=island.address,
            attempt=included.attempt,
            digest=included.digest,
            state=AuditState.awaiting_upload if drawn else AuditState.not_drawn,
            drawn_at=now,
        )
        session.add(audit)
        if drawn:
            _started_from(session, run, audit, now)
    session.flush()
    awaiting = select(IslandAudit.digest).where(
        IslandAudit.run_id == run.id,
        IslandAudit.outer_step.in_([body.outer_step - 1, body.outer_step]),
        IslandAudit.state == AuditState.awaiting_upload,
    )
    return sorted(set(session.scalars(awaiting)))


def _started_from(session: Session, run: Run, audit: IslandAudit, now: datetime) -> None:
    """An overlapped round started from the agreed weights minus the island's own pseudo-gradient of the step before,
    which its report names: a replay needs those bytes, so that step's audit is drawn too. A start the run never
    included (an honest island sends no round that started from one) convicts the island at once."""
    start = session.scalar(
        select(IslandShare.start_digest)
        .where(IslandShare.run_id == run.id, IslandShare.island == audit.island, IslandShare.attempt == audit.attempt)
        .limit(1)
    )
    if start is None:
        return
    before = session.scalar(
        select(IslandAudit).where(
            IslandAudit.run_id == run.id,
            IslandAudit.outer_step == audit.outer_step - 1,
            IslandAudit.island == audit.island,
            IslandAudit.digest == start,
        )
    )
    session.flush()
    if before is None:
        audit.state, audit.decided_at = AuditState.failed, now
        audit.outcome = f"outer step {audit.outer_step}: its round started from a pseudo-gradient the run never included"
        convict(session, run, audit, now)
        return
    audit.start_audit_id = before.id
    if before.state == AuditState.not_drawn:
        before.state = AuditState.awaiting_upload


def require_settled(session: Session, run: Run, signer: str, step: int) -> None:
    """Refuse (409) policy step ``step`` of an audited pretraining run from ``signer`` while a step it published before
    is not settled: settling draws a step's audits, so an island publishing alone and never settling would never be
    drawn (among several, the next publisher settles the step before it)."""
    if run.kind != RunKind.pretrain or pretraining.corpus_of(run)[1].audit_rate == 0:
        return
    published = select(PolicyManifest.id).where(
        PolicyManifest.run_id == run.id, PolicyManifest.step == IslandShare.outer_step + 1, PolicyManifest.signer == signer
    )
    unsettled = session.scalar(
        select(IslandShare.outer_step)
        .where(IslandShare.run_id == run.id, IslandShare.state == ShareState.pending, IslandShare.outer_step <= step - 2)
        .where(published.exists())
        .limit(1)
    )
    if unsettled is not None:
        raise ApiError(
            ErrorCode.conflict,
            f"Policy step {unsettled + 1} of {run.id}, published by {signer}, is not settled: settle it before publishing step {step}.",
        )


def admit_upload(session: Session, signer: str, run_id: str, digest: str) -> None:
    """Before a byte of an upload is read: 403 unless a trainer sends it, 404 unless a drawn audit of ``run_id``
    awaits a pseudo-gradient of that sha256."""
    roles.require(session, signer, RoleName.trainer)
    if _awaiting(session, run_id, digest) is None:
        raise ApiError(
            ErrorCode.not_found, f"No audit of {run_id or 'this run'} awaits a pseudo-gradient of sha256 {digest[:12]}."
        )


def record_upload(session: Session, signer: str, run_id: str, digest: str) -> int:
    """The pseudo-gradient of sha256 ``digest`` is stored under :func:`blob_key`: its audits open. Returns how many
    (0: another upload opened them already)."""
    roles.require(session, signer, RoleName.trainer)
    audits = session.scalars(
        select(IslandAudit).where(
            IslandAudit.run_id == run_id, IslandAudit.digest == digest, IslandAudit.state == AuditState.awaiting_upload
        )
    ).all()
    for audit in audits:
        audit.state, audit.blob_key = AuditState.open, blob_key(run_id, digest)
    return len(audits)


def _awaiting(session: Session, run_id: str, digest: str) -> int | None:
    return session.scalar(
        select(IslandAudit.id)
        .where(IslandAudit.run_id == run_id, IslandAudit.digest == digest, IslandAudit.state == AuditState.awaiting_upload)
        .limit(1)
    )


def open_audits(session: Session, signer: str, limit: int, settings: CoordinatorSettings, now: datetime) -> list[IslandAuditTask]:
    """Up to ``limit`` open audits of active runs drawn for the calling validator, oldest first.

    Audits nobody holds (new ones, ones a verdict left undecided, ones whose validator lost its role or let the run's
    ``audit_replay_s`` pass) are drawn first, each for a validator live by the committee's ``validator_live_s`` that
    has not judged it and is not the island, at random. So no validator picks what it judges: one colluding with an
    island cannot take its audits, and one that stops answering holds an audit for ``audit_replay_s`` at most."""
    roles.require(session, signer, RoleName.validator).last_seen = now
    validators = select(Role.address).where(Role.role == RoleName.validator, Role.revoked_at.is_(None))
    live = set(session.scalars(validators.where(Role.last_seen >= now - timedelta(seconds=settings.committee.validator_live_s))))
    holding = set(session.scalars(validators))
    start = aliased(IslandAudit)
    uploaded = select(start.id).where(start.blob_key.is_not(None))  # what an overlapped round started from
    replayable = (
        select(IslandAudit)
        .join(Run, Run.id == IslandAudit.run_id)
        .where(IslandAudit.state == AuditState.open, Run.status == RunStatus.active)
        .where(IslandAudit.start_audit_id.is_(None) | IslandAudit.start_audit_id.in_(uploaded))
        .order_by(IslandAudit.id)
    )
    for audit in session.scalars(replayable.where(IslandAudit.assignee.is_distinct_from(signer)).limit(DRAWS_PER_CALL)).all():
        _, pretrain = pretraining.corpus_of(session.get_one(Run, audit.run_id))
        fresh = audit.assigned_at is not None and audit.assigned_at >= now - timedelta(seconds=pretrain.audit_replay_s)
        if audit.assignee in holding and fresh:
            continue
        judged = set(session.scalars(select(IslandAuditVote.validator).where(IslandAuditVote.audit_id == audit.id)))
        pool = sorted(live - judged - {audit.address})
        if pool:
            audit.assignee, audit.assigned_at = _draws.choice(pool), now
    session.flush()
    return [_task(session, audit) for audit in session.scalars(replayable.where(IslandAudit.assignee == signer).limit(limit))]


def _task(session: Session, audit: IslandAudit) -> IslandAuditTask:
    run = session.get_one(Run, audit.run_id)
    manifest, _ = pretraining.corpus_of(run)
    overlapped = OuterSettings.model_validate(run.outer or {}).overlap
    reported = session.scalars(
        select(IslandShare.cursor)
        .where(IslandShare.run_id == audit.run_id, IslandShare.island == audit.island, IslandShare.attempt == audit.attempt)
        .where(IslandShare.outer_step == audit.outer_step)
        .order_by(IslandShare.position, IslandShare.cursor)
    )
    return IslandAuditTask(
        id=audit.id,
        run_id=audit.run_id,
        outer_step=audit.outer_step,
        start_step=max(audit.outer_step - 1, 0) if overlapped else audit.outer_step,
        island=audit.island,
        digest=audit.digest,
        slots=[pretraining.slot(manifest, cursor) for cursor in reported],
        start_audit=audit.start_audit_id,
    )


def audited_blob(session: Session, signer: str, audit_id: int) -> str:
    """The blob key of an audit's pseudo-gradient, for the validator drawn for it while it is open, or for one drawn for
    an open audit whose round started from it."""
    roles.require(session, signer, RoleName.validator)
    audit = _audit(session, audit_id)
    starting = select(IslandAudit.assignee).where(IslandAudit.start_audit_id == audit_id, IslandAudit.state == AuditState.open)
    if not (audit.state == AuditState.open and audit.assignee == signer) and signer not in set(session.scalars(starting)):
        raise ApiError(
            ErrorCode.conflict,
            f"Island audit {audit_id} ({audit.state}) is not open and drawn for {signer}: replay the ones drawn for you.",
        )
    if audit.blob_key is None:
        raise ApiError(ErrorCode.conflict, f"Audit {audit_id}'s pseudo-gradient is not uploaded yet.")
    return audit.blob_key


def _audit(session: Session, audit_id: int) -> IslandAudit:
    audit = session.get(IslandAudit, audit_id, with_for_update=True)
    if audit is None:
        raise ApiError(ErrorCode.not_found, f"No island audit {audit_id}.")
    return audit


def vote(
    session: Session, signer: str, audit_id: int, body: IslandAuditVerdict, settings: CoordinatorSettings, now: datetime
) -> IslandAuditInfo:
    """Record a validator's replay of an open audit (409 once decided, or judged by it already); the verdicts decide
    it once there are the run's ``audit_votes`` and :func:`decided` says so (a lone pass waits for a second opinion at
    the run's ``audit_second_opinion``), and each validator they outvote is struck, as on a submission
    (:func:`coordinator.services.accountability.strike`)."""
    roles.require(session, signer, RoleName.validator).last_seen = now
    audit = _audit(session, audit_id)
    if audit.state != AuditState.open:
        raise ApiError(ErrorCode.conflict, f"Island audit {audit_id} is {audit.state}: it takes no verdict.")
    if session.get(IslandAuditVote, (audit_id, signer)) is not None:
        raise ApiError(ErrorCode.conflict, f"{signer} judged island audit {audit_id} already.")
    if audit.assignee != signer:
        raise ApiError(ErrorCode.conflict, f"Island audit {audit_id} is not drawn for {signer}: replay the ones drawn for you.")
    run = session.get_one(Run, audit.run_id)
    _, pretrain = pretraining.corpus_of(run)
    passed = body.relative_error <= pretrain.audit_tolerance
    session.add(
        IslandAuditVote(
            audit_id=audit_id, validator=signer, relative_error=body.relative_error, cosine=body.cosine, passed=passed, at=now
        )
    )
    session.flush()
    votes = session.scalars(select(IslandAuditVote).where(IslandAuditVote.audit_id == audit_id)).all()
    failed = [v for v in votes if not v.passed]
    checked = len(votes) == 1 and passed and _draws.random() < pretrain.audit_second_opinion
    if len(votes) < pretrain.audit_votes or not decided(len(votes) - len(failed), len(failed)) or checked:
        audit.assignee = audit.assigned_at = None  # the next verdict is another validator's, drawn afresh
        return info(session, audit)
    errors = sorted(v.relative_error for v in votes)
    median = errors[len(errors) // 2]
    audit.decided_at = now
    audit.outcome = (
        f"outer step {audit.outer_step}: its pseudo-gradient is {median:.3g} from its replay in relative error "
        f"(tolerance {pretrain.audit_tolerance:g}; {len(failed)} of {len(votes)} validators fail it)"
    )
    audit.state = AuditState.failed if 2 * len(failed) > len(votes) else AuditState.passed
    for outvoted in [v for v in votes if v.passed != (audit.state == AuditState.passed)]:
        why = f"outvoted on island audit {audit.id} of {audit.island}, which {audit.state}"
        accountability.strike(session, outvoted.validator, None, why, settings, now, island_audit_id=audit.id)
    if audit.state == AuditState.failed:
        convict(session, run, audit, now)
    return info(session, audit)


def decided(passed: int, failed: int) -> bool:
    """Whether verdicts decide an audit: every one passes it, or one side holds a majority of at least two. One
    validator alone never fails an island (a conviction revokes it and slashes its stake), and an even split waits
    for another validator's replay."""
    return failed == 0 or (passed != failed and max(passed, failed) >= 2)


def convict(session: Session, run: Run, audit: IslandAudit, now: datetime) -> None:
    """The audited island lied about a published step: its trainer role goes, citing the audit, and every slot it
    holds or learnt goes back to the pool, to be learnt again by honest islands (none of its steps can be trusted, and
    the steps it published can no longer be fetched: their signer holds no role). Its other audits become moot."""
    reason = f"{AUDIT_FAILED} island {audit.island} of {run.id} (island audit {audit.id}): {audit.outcome}"
    role = roles.active(session, audit.address, RoleName.trainer)
    if role is not None:
        role.revoked_at, role.revoke_reason = now, reason
    session.execute(delete(IslandShare).where(IslandShare.run_id == run.id, IslandShare.island == audit.island))
    undecided = (AuditState.awaiting_upload, AuditState.open)
    others = (IslandAudit.run_id == run.id, IslandAudit.island == audit.island, IslandAudit.state.in_(undecided))
    said = f"not replayed: island audit {audit.id} convicted {audit.island} first"
    session.execute(update(IslandAudit).where(*others).values(state=AuditState.moot, decided_at=now, outcome=said))
    island = session.get_one(Island, (run.id, audit.island))
    island.excluded_steps += 1
    island.last_exclusion = f"{AUDIT_FAILED} {audit.outcome}"
    events.after_commit(session, "trainer %s lost its role: %s", audit.address, reason)


def info(session: Session, audit: IslandAudit) -> IslandAuditInfo:
    votes = session.scalar(select(func.count()).where(IslandAuditVote.audit_id == audit.id)) or 0
    return IslandAuditInfo(
        id=audit.id,
        run_id=audit.run_id,
        outer_step=audit.outer_step,
        island=audit.island,
        state=audit.state,
        votes=votes,
        outcome=audit.outcome,
        decided_at=audit.decided_at,
    )


def by_island(session: Session, run_id: str) -> dict[str, dict[str, int]]:
    """Each island's audits of ``run_id``, counted by state."""
    counts: dict[str, dict[str, int]] = {}
    query = select(IslandAudit.island, IslandAudit.state, func.count()).where(IslandAudit.run_id == run_id)
    for island, state, n in session.execute(query.group_by(IslandAudit.island, IslandAudit.state)):
        counts.setdefault(island, {})[str(state)] = n
    return counts
