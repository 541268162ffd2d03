"""How verdicts decide a submission, table by table: the majority, the receipt, who is outvoted, an appeal's result."""

from __future__ import annotations

from typing import Any

import pytest

from intellect_protocol.coordinator.models import Review
from intellect_protocol.coordinator.services.decisions import appeal_result, decision, majority, outvoted
from intellect_protocol.shared.committee import Outcome
from intellect_protocol.shared.states import AppealStatus

pytestmark = pytest.mark.unit

PASSED = {"name": "toploc", "passed": True, "reason": ""}
SAMPLING = {"name": "sampling", "passed": False, "reason": "token 4 was not the seeded draw"}
REWARD = {"name": "reward", "passed": False, "reason": "claimed 1.0, recomputed 0.0"}
NEAR_TIE = {**SAMPLING, "explained": True}


def verdict(outcome: Outcome, validator: str | None = "0xA", checks: list[Any] | None = None, **kw: Any) -> Review:
    return Review(outcome=outcome, validator=validator, checks=checks, signature=f"sig-{validator}", **kw)


@pytest.mark.parametrize(
    ("outcomes", "expected"),
    [
        (["accept"], "accept"),
        (["accept", "accept", "hard"], "accept"),
        (["hard", "accept", "hard"], "hard"),
        (["accept", "soft", "hard"], "soft"),  # rejected, but no majority says forged
        (["soft", "hard"], "soft"),
        (["accept", "hard"], "soft"),  # no majority to accept: never credit on a tie
        (["soft", "soft", "accept"], "soft"),
    ],
)
def test_majority(outcomes: list[Outcome], expected: Outcome) -> None:
    assert majority(outcomes) == expected


# (outcome, verdicts, note) -> (lead's validator, reason, untrained rows, charge_soft)
RECEIPTS = [
    pytest.param(
        "accept",
        [verdict("accept", "0xA", [PASSED], untrained_rows=[3]), verdict("accept", "0xB", [PASSED], untrained_rows=[1, 3])],
        None,
        ("0xA", "all checks passed", [1, 3], True),
        id="unanimous acceptance keeps every deciding validator's untrained rows out",
    ),
    pytest.param(
        "accept",
        [verdict("hard", "0xA", [SAMPLING], untrained_rows=[7]), verdict("accept", "0xB", [PASSED]), verdict("accept", "0xC")],
        None,
        ("0xB", "all checks passed", None, True),
        id="an outvoted verdict neither leads nor keeps rows out",
    ),
    pytest.param(
        "hard",
        [verdict("hard", "0xA", [PASSED, SAMPLING, REWARD])],
        None,
        ("0xA", "sampling: token 4 was not the seeded draw; reward: claimed 1.0, recomputed 0.0", None, True),
        id="a rejection names each failed check",
    ),
    pytest.param(
        "soft",
        [verdict("soft", "0xA", [NEAR_TIE])],
        None,
        ("0xA", "sampling: token 4 was not the seeded draw (numerics explain it: no strike)", None, False),
        id="failures numerics explain charge nothing",
    ),
    pytest.param(
        "soft",
        [verdict("soft", "0xA", [NEAR_TIE, REWARD])],
        None,
        (
            "0xA",
            "sampling: token 4 was not the seeded draw (numerics explain it: no strike); reward: claimed 1.0, recomputed 0.0",
            None,
            True,
        ),
        id="one unexplained failure charges the soft rejection",
    ),
    pytest.param(
        "soft",
        [verdict("accept", "0xA", [PASSED]), verdict("hard", "0xB", [SAMPLING])],
        None,
        ("0xA", "validators split accept, hard", None, False),
        id="a split nobody voted for judges no node",
    ),
    pytest.param(
        "accept",
        [verdict("accept", "0xA", [PASSED])],
        "audit waived: no independent validator holds the role",
        ("0xA", "all checks passed; audit waived: no independent validator holds the role", None, True),
        id="a waiver is written on the receipt",
    ),
]


@pytest.mark.parametrize(("outcome", "verdicts", "note", "expected"), RECEIPTS)
def test_the_receipt_a_decision_writes(
    outcome: Outcome, verdicts: list[Review], note: str | None, expected: tuple[Any, ...]
) -> None:
    decided = decision(outcome, verdicts, note)
    assert (decided.lead.validator, decided.reason, decided.untrained_rows, decided.charge_soft) == expected


@pytest.mark.parametrize(
    ("outcome", "verdicts", "appeal_id", "expected"),
    [
        pytest.param("accept", [verdict("hard", "0xA")], None, [], id="one verdict alone is outvoted by nobody"),
        pytest.param("accept", [verdict("accept", "0xA"), verdict("accept", "0xB")], None, [], id="agreement outvotes nobody"),
        pytest.param(
            "accept",
            [verdict("accept", "0xA"), verdict("hard", "0xB"), verdict("accept", "0xC")],
            None,
            [("0xB", "said hard where the majority decided accept")],
            id="the minority of a tie-break",
        ),
        pytest.param(
            "accept",
            [verdict("accept", "0xC", appeal_id="ap"), verdict("accept", "0xD", appeal_id="ap"), verdict("hard", "0xA")],
            "ap",
            [("0xA", "said hard where the majority decided accept on appeal")],
            id="the first committee loses on appeal",
        ),
        pytest.param(
            "hard",
            [verdict("accept", None), verdict("hard", "0xB"), verdict("hard", "0xC")],
            None,
            [],
            id="a verdict without a validator strikes nobody",
        ),
    ],
)
def test_who_a_decision_outvotes(
    outcome: Outcome, verdicts: list[Review], appeal_id: str | None, expected: list[tuple[str, str]]
) -> None:
    assert outvoted(verdicts, outcome, appeal_id) == expected


@pytest.mark.parametrize(
    ("prior", "outcome", "expected"),
    [
        ("hard", "hard", AppealStatus.upheld),
        ("soft", "soft", AppealStatus.upheld),
        ("hard", "soft", AppealStatus.overturned),
        ("hard", "accept", AppealStatus.overturned),
        ("soft", "accept", AppealStatus.overturned),
    ],
)
def test_an_appeal_s_result(prior: Outcome, outcome: Outcome, expected: AppealStatus) -> None:
    assert appeal_result(prior, outcome) == expected
