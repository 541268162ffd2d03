"""Settlement's ledger side: epochs (each a tree of cumulative final credit), proofs, anchors,
and the bans that are due to be slashed.

An epoch closes only when some address's cumulative final credit changed since the last one, so
an idle network spends no gas. Closing is a plain insert under the epoch number's primary key:
of two replicas closing the same epoch one wins, the other's insert fails and it moves on.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from eth_utils import keccak
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from intellect_protocol.coordinator.island_models import IslandAudit
from intellect_protocol.coordinator.models import ContributionEntry, Node, NodeStatusEvent, Role, ValidatorStrike
from intellect_protocol.coordinator.services.accountability import OUTVOTED
from intellect_protocol.coordinator.services.island_audits import AUDIT_FAILED
from intellect_protocol.coordinator.services.nodes import STRIKES_BAN, struck_submissions
from intellect_protocol.coordinator.settlement_models import Epoch, EpochAnchor, EpochLeaf, Slashing
from intellect_protocol.shared.merkle import CreditTree
from intellect_protocol.shared.schemas import NodeStatus, RoleName
from intellect_protocol.shared.settlement import EpochInfo, EpochProof, LedgerEntry, NodeSettlement, cumulative_amounts
from intellect_protocol.shared.states import AuditState


def latest_epoch(session: Session) -> Epoch | None:
    return session.scalar(select(Epoch).order_by(Epoch.epoch.desc()).limit(1))


def leaves(session: Session, epoch: int) -> dict[str, int]:
    rows = session.execute(select(EpochLeaf.address, EpochLeaf.cumulative).where(EpochLeaf.epoch == epoch))
    return {address: int(cumulative) for address, cumulative in rows}


def close_epoch(session: Session, now: datetime, lag_s: int = 0) -> Epoch | None:
    """Add the next epoch (the caller commits), or None when no final credit changed. Its cutoff is
    a whole second (the chain's unit) ``lag_s`` before ``now``."""
    cutoff = (now - timedelta(seconds=lag_s)).replace(microsecond=0)
    last = latest_epoch(session)
    last_entry_id = session.scalar(select(func.max(ContributionEntry.id))) or 0
    entries = session.execute(
        select(ContributionEntry.id, ContributionEntry.address, ContributionEntry.units, ContributionEntry.final_at).where(
            ContributionEntry.id <= last_entry_id, ContributionEntry.final_at <= cutoff
        )
    )
    amounts = cumulative_amounts(entries, last_entry_id, cutoff)
    if not amounts or (last is not None and leaves(session, last.epoch) == amounts):
        return None
    tree = CreditTree(amounts)
    epoch = Epoch(
        epoch=1 if last is None else last.epoch + 1,
        root="0x" + tree.root.hex(),
        last_entry_id=last_entry_id,
        cutoff=cutoff,
        addresses=len(amounts),
        total=str(sum(amounts.values())),
        created_at=now,
    )
    session.add(epoch)
    session.flush()  # the epoch row first: a replica that closed it already fails here, before the leaves
    session.add_all(EpochLeaf(epoch=epoch.epoch, address=a, cumulative=str(v)) for a, v in amounts.items())
    return epoch


def unanchored(session: Session) -> list[Epoch]:
    anchored = select(EpochAnchor.epoch)
    return list(session.scalars(select(Epoch).where(Epoch.epoch.not_in(anchored)).order_by(Epoch.epoch)))


def record_anchor(session: Session, epoch: int, tx_hash: str, block: int, now: datetime) -> None:
    if session.get(EpochAnchor, epoch) is None:
        session.add(EpochAnchor(epoch=epoch, tx_hash=tx_hash, block=block, anchored_at=now))


def epoch_infos(session: Session, limit: int, epoch: int | None = None) -> list[EpochInfo]:
    """Newest first (or the one ``epoch``), each with its anchor once confirmed."""
    query = (
        select(Epoch, EpochAnchor)
        .outerjoin(EpochAnchor, EpochAnchor.epoch == Epoch.epoch)
        .order_by(Epoch.epoch.desc())
        .limit(limit)
    )
    if epoch is not None:
        query = query.where(Epoch.epoch == epoch)
    return [
        EpochInfo(
            epoch=e.epoch,
            root=e.root,
            last_entry_id=e.last_entry_id,
            cutoff=e.cutoff,
            addresses=e.addresses,
            total=e.total,
            created_at=e.created_at,
            tx_hash=a and a.tx_hash,
            block=a and a.block,
            anchored_at=a and a.anchored_at,
        )
        for e, a in session.execute(query).all()
    ]


_trees: dict[str, CreditTree] = {}
"""Recent trees by root (a root names its leaves, so a cached tree never goes stale)."""


def proof(session: Session, epoch: int, address: str) -> EpochProof | None:
    """``address``'s cumulative amount in ``epoch`` and its proof; None if it has no leaf there."""
    root = session.scalar(select(Epoch.root).where(Epoch.epoch == epoch))
    if root is None:
        return None
    tree = _trees.get(root)
    if tree is None:
        tree = _trees[root] = CreditTree(leaves(session, epoch))
        for old in list(_trees)[:-4]:
            _trees.pop(old, None)
    cumulative = session.scalar(select(EpochLeaf.cumulative).where(EpochLeaf.epoch == epoch, EpochLeaf.address == address))
    if cumulative is None:
        return None
    return EpochProof(
        epoch=epoch,
        address=address,
        cumulative=cumulative,
        proof=["0x" + s.hex() for s in tree.proof(address)],
        root="0x" + tree.root.hex(),
    )


def ledger_page(session: Session, after: int, limit: int) -> list[LedgerEntry]:
    """Ledger entries with id after ``after``, oldest first: the export anyone rebuilds roots from."""
    rows = session.scalars(
        select(ContributionEntry).where(ContributionEntry.id > after).order_by(ContributionEntry.id).limit(limit)
    )
    return [LedgerEntry.model_validate(row, from_attributes=True) for row in rows]


@dataclass
class DueSlash:
    address: str
    ban_event_id: int | None
    """The node's ban, or None for a role's revocation (``role_id``)."""
    submissions: list[str]
    """The evidence: the submissions whose hard rejections still count against the node, or on
    which the validator was outvoted (their receipts show every signed verdict), or the trainer's failed
    island audits (``island-audit:ID``)."""
    role_id: int | None = None

    @property
    def evidence(self) -> bytes:
        return keccak(",".join(sorted(self.submissions)).encode())


def slashes_due(session: Session, now: datetime, window_s: float) -> list[DueSlash]:
    """Nodes banned for strikes whose ban outlasted the dispute window (appeals could lift it until
    then) and was not carried to the chain yet."""
    due = []
    banned = session.scalars(select(Node.address).where(Node.status == NodeStatus.banned, Node.ban_reason.endswith(STRIKES_BAN)))
    for address in banned:
        event = session.scalar(
            select(NodeStatusEvent)
            .where(NodeStatusEvent.address == address, NodeStatusEvent.to_status == NodeStatus.banned)
            .order_by(NodeStatusEvent.id.desc())
            .limit(1)
        )
        if event is None or event.at > now - timedelta(seconds=window_s):
            continue
        if session.scalar(select(Slashing.id).where(Slashing.ban_event_id == event.id)) is not None:
            continue
        due.append(DueSlash(address, event.id, struck_submissions(session, address)))
    return due + _revocations_due(session, now - timedelta(seconds=window_s))


def _revocations_due(session: Session, before: datetime) -> list[DueSlash]:
    """Validators revoked for being outvoted, and trainers revoked for a failed island audit, before ``before``
    whom no admin granted the role again."""
    due = []
    revoked = select(Role).where(
        Role.revoked_at <= before,
        ((Role.role == RoleName.validator) & Role.revoke_reason.startswith(OUTVOTED))
        | ((Role.role == RoleName.trainer) & Role.revoke_reason.startswith(AUDIT_FAILED)),
    )
    for role in session.scalars(revoked):
        if session.scalar(select(Slashing.id).where(Slashing.role_id == role.id)) is not None:
            continue
        if session.scalar(select(Role.id).where(Role.address == role.address, Role.role == role.role, Role.id > role.id)):
            continue
        due.append(DueSlash(role.address, None, _evidence(session, role), role_id=role.id))
    return due


def _evidence(session: Session, role: Role) -> list[str]:
    """What a revoked role is slashed citing: the submissions and island audits (``island-audit:ID``) its validator was
    outvoted on, or its trainer's failed island audits."""
    if role.role == RoleName.trainer:
        failed = select(IslandAudit.id).where(
            IslandAudit.address == role.address,
            IslandAudit.state == AuditState.failed,
            IslandAudit.decided_at >= role.granted_at,
            IslandAudit.decided_at <= role.revoked_at,
        )
        return [f"island-audit:{audit_id}" for audit_id in session.scalars(failed)]
    outvoted = session.execute(
        select(ValidatorStrike.submission_id, ValidatorStrike.island_audit_id).where(
            ValidatorStrike.validator == role.address,
            ValidatorStrike.at >= role.granted_at,
            ValidatorStrike.at <= role.revoked_at,
        )
    )
    return sorted({submission or f"island-audit:{audit}" for submission, audit in outvoted})


def record_slashing(session: Session, due: DueSlash, amount: int, tx_hash: str | None, now: datetime) -> None:
    session.add(
        Slashing(
            address=due.address,
            ban_event_id=due.ban_event_id,
            role_id=due.role_id,
            evidence="0x" + due.evidence.hex(),
            submissions=sorted(due.submissions),
            amount=str(amount),
            tx_hash=tx_hash,
            at=now,
        )
    )


def slashed(session: Session) -> dict[str, int]:
    """Base units slashed per address, as recorded."""
    totals: dict[str, int] = {}
    for address, amount in session.execute(select(Slashing.address, Slashing.amount)):
        totals[address] = totals.get(address, 0) + int(amount)
    return totals


def anchored_leaves(session: Session) -> dict[str, int]:
    """Leaves of the newest epoch confirmed on chain (what claims pay against now)."""
    newest = session.scalar(select(func.max(EpochAnchor.epoch)))
    return {} if newest is None else leaves(session, newest)


def node_settlement(chain: Any, addresses: list[str], earned: dict[str, int], slashed: dict[str, int]) -> list[NodeSettlement]:
    """Each address's stake and claims as the chain holds them (call from a worker thread: one RPC per value)."""
    found = []
    for address in addresses:
        staked = chain.stake_of(address)
        unbonding = chain.registry.functions.unbonding(address).call()
        claimed = chain.claimed(address)
        cumulative = earned.get(address, 0)
        found.append(
            NodeSettlement(
                address=address,
                staked=str(staked),
                unbonding=str(unbonding),
                slashed=str(slashed.get(address, 0)),
                earned=str(cumulative),
                claimed=str(claimed),
                claimable=str(max(0, cumulative - claimed)),
            )
        )
    return found
