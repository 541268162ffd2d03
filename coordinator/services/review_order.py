"""The order validators are handed reviews in, by the coordinator's draw and by each validator's claim."""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import bindparam, case, exists, or_
from sqlalchemy.orm import aliased

from intellect_protocol.coordinator.models import Review, Submission, Task
from intellect_protocol.shared.states import SubmissionStatus

NEWCOMER_WAIT_S = 30.0
"""How long a file of an address with no accepted file yet waits behind proven nodes' work at most."""

_proven = aliased(Submission)
PROVEN = exists().where(_proven.address == Submission.address, _proven.status == SubmissionStatus.accepted)
"""Whether a review's file (Submission joined) is of an address with an accepted file."""
NEWCOMER = case((or_(Review.opened_at <= bindparam("newcomers_before"), PROVEN), 0), else_=1)
"""1 for a review of a newcomer's file still waiting behind proven nodes' work, else 0."""
URGENT_FIRST = (case((Review.purpose == "appeal", 1), else_=0), NEWCOMER, Task.policy_step, Review.opened_at, Review.id)
"""Review order (with Submission and Task joined): appeals after all other work; then work of addresses with an
accepted file before a newcomer's, for :data:`NEWCOMER_WAIT_S` (a flood of fresh wallets' files does not hold
up proven nodes' work, and cannot starve a new honest node either); then the oldest policy first (it goes
stale first). Its statements take ``newcomers_before`` (:func:`order_params`)."""


def order_params(now: datetime) -> dict[str, datetime]:
    return {"newcomers_before": now - timedelta(seconds=NEWCOMER_WAIT_S)}
