"""A node, an admin and a validator speaking the protocol by hand against a served coordinator: real keys,
real signatures, files made by the node's own code (and forged ones rewritten from them)."""

from __future__ import annotations

from eth_account import Account
from eth_account.signers.local import LocalAccount
from sqlalchemy import select

from intellect_protocol.coordinator.db import make_sessionmaker
from intellect_protocol.coordinator.models import ContributionEntry, Submission
from intellect_protocol.node.work import finish, generate
from intellect_protocol.shared.rollout_file import read_rollouts, write_rollouts
from intellect_protocol.shared.schemas import TaskSpec
from tests.conftest import Served
from tests.helpers import HTTP, register_body, signed_post
from tests.support.adversary import random_tokens


def grant(served: Served, token: str, address: str, role: str) -> None:
    reply = HTTP.post(
        f"{served.url}/v1/admin/roles", json={"address": address, "role": role}, headers={"authorization": f"Bearer {token}"}
    )
    assert reply.status_code == 201, reply.text


def joined(served: Served, account: LocalAccount | None = None) -> LocalAccount:
    """``account`` (a fresh one if None), registered as a node."""
    account = account or Account.create()
    assert signed_post(served.url, "/v1/nodes/register", account, served.audience, register_body(account)).status_code == 200
    return account


def lease(served: Served, account: LocalAccount) -> TaskSpec:
    reply = signed_post(served.url, "/v1/tasks/lease", account, served.audience, {"address": account.address})
    assert reply.status_code == 200, reply.text
    return TaskSpec.model_validate(reply.json())


def upload(served: Served, account: LocalAccount, task: TaskSpec, data: bytes) -> str:
    reply = signed_post(served.url, "/v1/submissions", account, served.audience, data, query=f"task={task.task_id}")
    assert reply.status_code == 200, reply.text
    return reply.json()["submission_id"]


def forge(task: TaskSpec) -> bytes:
    """Random tokens, proven with one prefill of the real model: TOPLOC alone would pass them."""
    rollouts = read_rollouts(finish(generate(task)).data)
    random_tokens(rollouts, task)
    return write_rollouts(rollouts)


def check_ledger(served: Served) -> None:
    """The ledger's invariants: credit only for accepted (or later invalidated) work, clawbacks
    negative and never more than was earned, every balance the sum of its entries."""
    with make_sessionmaker(served.engine)() as session:
        entries = list(session.scalars(select(ContributionEntry)))
        statuses = {s.id: (s.address, s.status) for s in session.scalars(select(Submission))}
    totals: dict[str, int] = {}
    per_submission: dict[str, int] = {}
    for entry in entries:
        address, status = statuses[entry.submission_id]
        assert address == entry.address
        if entry.kind == "credit":
            assert entry.units > 0 and status in ("accepted", "invalidated", "pending", "rejected")
        else:
            assert (entry.kind, entry.units > 0) in (("clawback", False), ("restore", True))
        totals[entry.address] = totals.get(entry.address, 0) + entry.units
        per_submission[entry.submission_id] = per_submission.get(entry.submission_id, 0) + entry.units
    assert all(isinstance(e.units, int) for e in entries), "money is integers"
    assert all(total >= 0 for total in per_submission.values()), "a clawback exceeded its credit"
    assert all(
        per_submission.get(sid, 0) == 0 for sid, (_, status) in statuses.items() if status not in ("accepted", "pending")
    ), "rejected work kept credit"
    for address, total in totals.items():
        shown = HTTP.get(f"{served.url}/v1/public/nodes/{address}/credit").json()
        assert shown["pending"] + shown["final"] == total


def claim_all(served: Served, validator: LocalAccount, limit: int = 64) -> list[dict]:
    """Up to ``limit`` reviews drawn for ``validator``, claiming again while more come: a newcomer's file or an
    appeal comes alone, so a batch of them takes one claim each."""
    drawn: list[dict] = []
    while len(drawn) < limit:
        body = {"address": validator.address, "limit": limit - len(drawn)}
        reply = signed_post(served.url, "/v1/validation/claim", validator, served.audience, body)
        assert reply.status_code == 200, reply.text
        if not reply.json():
            break
        drawn += reply.json()
    return drawn
