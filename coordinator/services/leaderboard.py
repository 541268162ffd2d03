"""What the public leaderboard page shows: nodes ranked by credit, the network's status, throughput.

Aggregates are grouped SQL over the ledger; nothing here writes.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timedelta

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from intellect_protocol.coordinator.models import ContributionEntry, Node, Run, Submission
from intellect_protocol.coordinator.services import admission, nodes, shardcast
from intellect_protocol.coordinator.services.learning_signal import learning_signal
from intellect_protocol.coordinator.settings import CoordinatorSettings
from intellect_protocol.shared.public_schemas import Credit, LeaderboardRow, NetworkStatus, PublicNode, ThroughputBucket
from intellect_protocol.shared.run_schemas import RunInfo
from intellect_protocol.shared.schemas import NodeStatus
from intellect_protocol.shared.states import RunStatus, SubmissionStatus

REJECTED = (SubmissionStatus.rejected, SubmissionStatus.invalidated)


def _submission_counts(session: Session, address: str | None = None) -> dict[str, dict[str, tuple[int, int]]]:
    """address -> status -> (submissions, tokens)."""
    query = select(Submission.address, Submission.status, func.count(), func.coalesce(func.sum(Submission.tokens), 0))
    if address is not None:
        query = query.where(Submission.address == address)
    out: dict[str, dict[str, tuple[int, int]]] = defaultdict(dict)
    for who, status, count, tokens in session.execute(query.group_by(Submission.address, Submission.status)):
        out[who][status] = (int(count), int(tokens))
    return out


def _credits(session: Session, now: datetime) -> dict[str, tuple[int, int]]:
    """address -> (pending, final) credit micro-units."""
    is_final = ContributionEntry.final_at <= now
    query = select(ContributionEntry.address, is_final, func.sum(ContributionEntry.units)).group_by(
        ContributionEntry.address, is_final
    )
    out: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for who, final, units in session.execute(query):
        out[who][1 if final else 0] += int(units)
    return {k: (v[0], v[1]) for k, v in out.items()}


def ranking(session: Session, now: datetime, limit: int) -> list[LeaderboardRow]:
    counts, credits = _submission_counts(session), _credits(session, now)
    rows = []
    for node in session.scalars(select(Node)):
        mine = counts.get(node.address, {})
        accepted, tokens = mine.get(SubmissionStatus.accepted, (0, 0))
        rejected = sum(mine.get(s, (0, 0))[0] for s in REJECTED)
        pending, final = credits.get(node.address, (0, 0))
        rows.append(
            LeaderboardRow(
                rank=0,
                address=node.address,
                status=NodeStatus(node.status),
                final_credit=final,
                pending_credit=pending,
                accepted_tokens=tokens,
                accepted=accepted,
                rejected=rejected,
                acceptance_rate=accepted / (accepted + rejected) if accepted + rejected else None,
                last_seen=node.last_seen,
            )
        )
    rows.sort(key=lambda r: (-r.final_credit, -r.pending_credit, -r.accepted_tokens, r.address))
    for i, row in enumerate(rows):
        row.rank = i + 1
    return rows[:limit]


def public_node(session: Session, address: str, now: datetime) -> PublicNode:
    node = nodes.get_node(session, address)
    pending, final = _credits(session, now).get(address, (0, 0))
    counts = {status: n for status, (n, _) in _submission_counts(session, address).get(address, {}).items()}
    return PublicNode(
        address=node.address,
        status=NodeStatus(node.status),
        first_seen=node.first_seen,
        last_seen=node.last_seen,
        credit=Credit(address=node.address, pending=pending, final=final),
        submissions=counts,
    )


RATE_WINDOW_MIN = 5
"""Minutes over which the network's upload rate is averaged."""


def network(session: Session, settings: CoordinatorSettings, now: datetime) -> NetworkStatus:
    run = session.scalar(select(Run).where(Run.status == RunStatus.active).order_by(Run.created_at.desc()).limit(1))
    latest = run or session.scalar(select(Run).order_by(Run.created_at.desc()).limit(1))
    counts = nodes.status_counts(session)
    by_status = dict(session.execute(select(Submission.status, func.count()).group_by(Submission.status)).all())
    verdicts = sum(by_status.get(s, 0) for s in (SubmissionStatus.accepted, *REJECTED))
    first, recent = session.execute(
        select(func.min(Submission.created_at), func.coalesce(func.sum(Submission.rows), 0)).where(
            Submission.created_at >= now - timedelta(minutes=RATE_WINDOW_MIN)
        )
    ).one()
    # Over the time uploads have come in, not the whole window: a run younger than five minutes
    # would otherwise show a fraction of the rate its throughput chart draws.
    minutes = min(RATE_WINDOW_MIN, max(1.0, (now - first).total_seconds() / 60)) if first else RATE_WINDOW_MIN
    return NetworkStatus(
        run=RunInfo.model_validate(run, from_attributes=True) if run else None,
        policy_step=run.policy_step if run else 0,
        nodes=counts,
        nodes_online=counts[NodeStatus.healthy],
        rollouts_per_minute=int(recent or 0) / minutes,
        validation_backlog=by_status.get(SubmissionStatus.pending, 0),
        rejection_rate=sum(by_status.get(s, 0) for s in REJECTED) / verdicts if verdicts else None,
        relays=len(shardcast.live_relays(session, now, settings.relay_ttl_s)),
        work=admission.work_wait(session, latest, settings, now) if latest else admission.NO_RUN,
        learning_stalled=learning_signal(session, run, now).stalled if run else None,
        server_time=now,
    )


def throughput(session: Session, run_id: str, now: datetime, minutes: int, bucket_s: int) -> list[ThroughputBucket]:
    """Uploads of ``run_id`` over the last ``minutes``, in buckets of ``bucket_s`` seconds, oldest first."""
    start = now - timedelta(minutes=minutes)
    query = select(Submission.created_at, Submission.status, Submission.rows, Submission.tokens).where(
        Submission.run_id == run_id, Submission.created_at >= start
    )
    n = max(1, (minutes * 60 + bucket_s - 1) // bucket_s)
    buckets = [ThroughputBucket(start=start + timedelta(seconds=i * bucket_s), rollouts=0, accepted_tokens=0) for i in range(n)]
    for created_at, status, rows, tokens in session.execute(query):
        bucket = buckets[min(n - 1, int((created_at - start).total_seconds()) // bucket_s)]
        bucket.rollouts += rows
        if status == SubmissionStatus.accepted:
            bucket.accepted_tokens += tokens
    return buckets
