"""What `intellect-node verify-epoch` judges, from the chain's roots, the coordinator's list and the ledger."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from intellect_protocol.node.settlement import audit_epochs
from intellect_protocol.shared.chain import PostedRoot
from intellect_protocol.shared.settlement import EpochInfo

pytestmark = pytest.mark.unit

ROOT = b"\x11" * 32
AT = 1_800_000_000


def listed(epoch: int, tx: str | None = "0xaa", cutoff: int = AT, root: bytes = ROOT) -> EpochInfo:
    when = datetime.fromtimestamp(cutoff, UTC)
    return EpochInfo(
        epoch=epoch, root="0x" + root.hex(), last_entry_id=1, cutoff=when, addresses=1, total="1", created_at=when, tx_hash=tx
    )


def test_an_honest_epoch_passes_and_a_fresh_one_waits() -> None:
    posted = {1: PostedRoot(ROOT, AT, "0xaa", AT + 5)}
    found = audit_epochs([1, 2], posted, {1: listed(1), 2: listed(2, tx=None)}, {1: ROOT, 2: ROOT}, chain_latest=1)
    assert found == [(1, None), (2, "waiting to be anchored")]


@pytest.mark.parametrize(
    ("posted", "ours", "rebuilt", "latest", "says"),
    [
        # The operator posted a root nobody lists (and claimed with it).
        ({1: PostedRoot(ROOT, AT, "0xaa", AT)}, {}, {}, 1, "does not list"),
        # A listed root whose transaction the coordinator hides.
        ({1: PostedRoot(ROOT, AT, "0xaa", AT)}, {1: listed(1, tx=None)}, {1: ROOT}, 1, "lists transaction none"),
        # Listed, never posted, and the chain has moved past it: it can never be anchored.
        ({}, {1: listed(1, tx=None)}, {1: ROOT}, 3, "moved past it"),
        # A cutoff after the posting block: credit still open to dispute was paid.
        ({1: PostedRoot(ROOT, AT + 100, "0xaa", AT)}, {1: listed(1, cutoff=AT + 100)}, {1: ROOT}, 1, "open to dispute"),
        # The coordinator lists another cutoff than the chain's.
        ({1: PostedRoot(ROOT, AT, "0xaa", AT)}, {1: listed(1, cutoff=AT - 1)}, {1: ROOT}, 1, "is not the chain's"),
        # The ledger gives another root.
        ({1: PostedRoot(ROOT, AT, "0xaa", AT)}, {1: listed(1)}, {1: b"\x22" * 32}, 1, "the ledger gives 0x2222"),
    ],
)
def test_every_lie_is_a_finding(posted, ours, rebuilt, latest, says) -> None:
    [(epoch, problem)] = audit_epochs([1], posted, ours, rebuilt, latest)
    assert epoch == 1 and problem is not None and says in problem and not problem.startswith("waiting"), problem
