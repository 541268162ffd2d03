"""Validators held to account: strikes when outvoted, automatic revocation, agreement rates.

A validator whose verdict differs from its committee's decision is outvoted: one strike. After
``validator_max_strikes`` strikes since it was last granted the role, the role is revoked (the
committee then re-checks its recent verdicts, see :mod:`coordinator.services.committee`).
Nodes are suspect too (:func:`suspect_node`): their approvals are audited more often.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from sqlalchemy import case, func, select
from sqlalchemy.orm import Session

from intellect_protocol.coordinator import events
from intellect_protocol.coordinator.models import Node, Review, Role, Submission, ValidatorStrike
from intellect_protocol.coordinator.services import roles
from intellect_protocol.coordinator.settings import CoordinatorSettings
from intellect_protocol.shared.committee import ValidatorStanding
from intellect_protocol.shared.schemas import RoleName

OUTVOTED = "outvoted by the majority"
"""How a revocation for strikes begins: such a validator is slashed once the dispute window passed."""


def strike(
    session: Session,
    validator: str,
    submission_id: str | None,
    reason: str,
    settings: CoordinatorSettings,
    now: datetime,
    island_audit_id: int | None = None,
) -> Literal["struck", "revoked"] | None:
    """Record that ``validator`` was outvoted (once per submission, or per island audit): "revoked" when this strike
    just cost it the role, "struck" when it keeps it, None when nothing new was recorded or it held no role."""
    if session.scalar(
        select(ValidatorStrike.id).where(
            ValidatorStrike.validator == validator,
            ValidatorStrike.submission_id == submission_id
            if island_audit_id is None
            else ValidatorStrike.island_audit_id == island_audit_id,
        )
    ):
        return None
    session.add(
        ValidatorStrike(validator=validator, submission_id=submission_id, island_audit_id=island_audit_id, reason=reason, at=now)
    )
    role = roles.active(session, validator, RoleName.validator)
    if role is None:
        return None
    session.flush()
    count = strikes_since(session, validator, role.granted_at)
    if count < settings.committee.validator_max_strikes:
        return "struck"
    role.revoked_at = now
    role.revoke_reason = f"{OUTVOTED} {count} times (the limit is {settings.committee.validator_max_strikes})"
    events.after_commit(session, "validator %s lost its role: %s", validator, role.revoke_reason)
    return "revoked"


def strikes_since(session: Session, validator: str, since: datetime) -> int:
    return session.scalar(select(func.count()).where(ValidatorStrike.validator == validator, ValidatorStrike.at >= since)) or 0


def suspect(session: Session, validator: str, new_validator_verdicts: int) -> bool:
    """Under suspicion: outvoted since its grant, or too new for anyone to vouch for its verdicts."""
    role = roles.active(session, validator, RoleName.validator)
    if role is None or strikes_since(session, validator, role.granted_at) > 0:
        return True
    given = session.scalar(select(func.count()).where(Review.validator == validator, Review.outcome.is_not(None))) or 0
    return given < new_validator_verdicts


def agreement(session: Session, validators: set[str]) -> dict[str, tuple[int, int, int]]:
    """(verdicts, compared, agreed) of each of ``validators``."""
    if not validators:
        return {}
    rows = session.execute(
        select(Review.validator, func.count(), func.count(Review.agreed), func.sum(case((Review.agreed.is_(True), 1), else_=0)))
        .where(Review.validator.in_(validators), Review.outcome.is_not(None))
        .group_by(Review.validator)
    ).all()
    out = dict.fromkeys(validators, (0, 0, 0))
    out.update({v: (int(n), int(c), int(a or 0)) for v, n, c, a in rows})
    return out


def rate(compared: int, agreed: int) -> float | None:
    return agreed / compared if compared else None


def rows_trained_then_rejected(session: Session, validators: set[str]) -> dict[str, int]:
    """Per validator, rows of work it approved that the trainer read before the acceptance fell."""
    query = (
        select(Review.validator, func.sum(Submission.trained_rows))
        .join(Submission, Submission.id == Review.submission_id)
        .where(
            Review.validator.in_(validators),
            Review.outcome == "accept",
            Submission.trained_rows > 0,
            Submission.outcome != "accept",
        )
        .group_by(Review.validator)
    )
    return {v: int(n or 0) for v, n in session.execute(query) if v is not None}


def standings(session: Session) -> list[ValidatorStanding]:
    """Every address that ever held the validator role, the active ones first."""
    grants = list(session.scalars(select(Role).where(Role.role == RoleName.validator).order_by(Role.id)))
    latest = {g.address: g for g in grants}  # the newest grant of each address says where it stands
    counts = agreement(session, set(latest))
    trained = rows_trained_then_rejected(session, set(latest))
    out = []
    for address, grant in latest.items():
        verdicts, compared, agreed = counts[address]
        out.append(
            ValidatorStanding(
                address=address,
                active=grant.revoked_at is None,
                verdicts=verdicts,
                compared=compared,
                agreed=agreed,
                agreement_rate=rate(compared, agreed),
                strikes=strikes_since(session, address, grant.granted_at),
                revoke_reason=grant.revoke_reason,
                rows_trained_then_rejected=trained.get(address, 0),
            )
        )
    return sorted(out, key=lambda s: (not s.active, -s.verdicts))


def suspect_node(session: Session, address: str) -> bool:
    """A node with a strike, or whose work any validator called forged (a verdict not voided): its
    approvals are audited like a suspect validator's, so a rogue cannot wave its forgeries through."""
    node = session.get(Node, address)
    if node is not None and node.strikes > 0:
        return True
    called_forged = (
        select(Review.id)
        .join(Submission, Submission.id == Review.submission_id)
        .where(Submission.address == address, Review.outcome == "hard", Review.voided_at.is_(None))
        .limit(1)
    )
    return session.scalar(called_forged) is not None
