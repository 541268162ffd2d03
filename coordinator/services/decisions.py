"""How a committee's verdicts decide a submission, as pure functions of the verdicts: the majority rule, the
receipt that the decision writes, and who the decision outvotes. :mod:`coordinator.services.committee`
applies them to the ledger (credit, strikes, appeals)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from intellect_protocol.coordinator.models import Review
from intellect_protocol.shared.committee import Outcome
from intellect_protocol.shared.states import AppealStatus


def majority(outcomes: Sequence[Outcome]) -> Outcome:
    """Accepted if most accept, forged if most say so, else rejected without a strike."""
    n = len(outcomes)
    if 2 * outcomes.count("accept") > n:
        return "accept"
    if 2 * outcomes.count("hard") > n:
        return "hard"
    return "soft"


@dataclass(frozen=True)
class Decision:
    """What a committee's verdicts make of a submission (:func:`decision`), before anything is written."""

    lead: Review
    """The verdict the receipt shows: the first that voted with the outcome (the first at all where none did)."""
    reason: str
    """The receipt's sentence: the failed checks of the lead verdict, a split, a waiver."""
    untrained_rows: list[int] | None
    """Rows of accepted work the deciding validators kept out of training."""
    charge_soft: bool
    """Whether a soft rejection counts towards a strike: not when numerics explain every failed check,
    nor when no verdict voted with the outcome (a split nobody could break judges no node)."""


def decision(outcome: Outcome, reviews: Sequence[Review], note: str | None = None) -> Decision:
    """The receipt of ``reviews`` deciding ``outcome`` (a pure function of the verdicts)."""
    deciding = [r for r in reviews if r.outcome == outcome]
    lead = deciding[0] if deciding else reviews[0]
    failed = [c for c in lead.checks or [] if c["passed"] is False]
    explained = bool(failed) and all(c.get("explained") for c in failed)
    reasons = [
        f"{c['name']}: {c['reason']}" + (" (numerics explain it: no strike)" if c.get("explained") else "") for c in failed
    ]
    if outcome != "accept" and lead.outcome != outcome:
        reasons.insert(0, f"validators split {', '.join(r.outcome or '' for r in reviews)}")
    rows = sorted({i for r in deciding for i in r.untrained_rows or []})
    return Decision(
        lead=lead,
        reason="; ".join([*(reasons or ["all checks passed"]), *([note] if note else [])]),
        untrained_rows=rows if outcome == "accept" and rows else None,
        charge_soft=not (explained or not deciding),
    )


def outvoted(judged: Sequence[Review], outcome: Outcome, appeal_id: int | None) -> list[tuple[str, str]]:
    """(validator, why) for each verdict of ``judged`` on the losing side of ``outcome``; none unless at least
    two verdicts judged (one alone is outvoted by nobody). Verdicts of an earlier committee than the appeal
    ``appeal_id`` lose "on appeal"."""
    if len(judged) < 2:
        return []
    return [
        (
            r.validator,
            f"said {r.outcome} where the majority decided {outcome}" + (" on appeal" if r.appeal_id != appeal_id else ""),
        )
        for r in judged
        if r.outcome != outcome and r.validator is not None
    ]


def appeal_result(prior: Outcome, outcome: Outcome) -> AppealStatus:
    """An appeal of a ``prior`` decision that its committee decided as ``outcome``: upheld when nothing changed."""
    return AppealStatus.upheld if outcome == prior else AppealStatus.overturned
