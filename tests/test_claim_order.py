"""Which review a validator is handed first: a flood of fresh wallets' files (round four's sybils) waits behind
the work of nodes with an accepted file, for a bounded time, and is handed out one file at a time, so it neither
holds up honest work nor starves a new honest node. A validator stopped mid-batch finishes the file in hand and
leaves the rest to go back to the queue."""

from __future__ import annotations

import io
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from eth_account import Account
from eth_account.signers.local import LocalAccount
from rich.console import Console

from intellect_protocol.coordinator.clock import Clock, system_clock
from intellect_protocol.coordinator.routers import validation as validation_router
from intellect_protocol.coordinator.services import validation
from intellect_protocol.coordinator.services.review_order import NEWCOMER_WAIT_S
from intellect_protocol.coordinator.settings import CoordinatorSettings
from intellect_protocol.node.work import finish, generate
from intellect_protocol.shared.committee import PublicReceipt
from intellect_protocol.shared.run_schemas import AuditPolicy
from intellect_protocol.shared.schemas import Claim, SamplingParams
from intellect_protocol.validator.worker import Validator
from tests.conftest import LIFTED, Served, admin_token, serve
from tests.helpers import checks_for, hung_up, make_run, signed_post, verdict_body
from tests.support.clock import MovableClock
from tests.support.protocol import grant, joined, lease, upload

pytestmark = pytest.mark.integration


def _settings(sqlite_url: str, tmp_path: Path, linked: list[list[str]] | None = None) -> CoordinatorSettings:
    return CoordinatorSettings(
        database_url=sqlite_url,
        blob_dir=tmp_path / "blobs",
        **LIFTED,
        heartbeat_interval_s=3600,
        linked_addresses=linked or [],
    )


@contextmanager
def _reviewing(settings: CoordinatorSettings, *validators: LocalAccount, clock: Clock = system_clock) -> Iterator[Served]:
    """A served run of four-token tasks, none drawn for audit, ``validators`` granted the role."""
    with serve(settings, clock=clock) as served:
        make_run(served, sampling=SamplingParams(max_tokens=4), audit=AuditPolicy(share=0, new_node_share=0, suspect_share=0))
        for validator in validators:
            grant(served, admin_token(served), validator.address, "validator")
        yield served


def _submit(served: Served, node: LocalAccount) -> str:
    task = lease(served, node)
    return upload(served, node, task, finish(generate(task)).data)


def _claim(served: Served, validator: LocalAccount, limit: int = 4, wait_s: float = 0.0) -> list[dict]:
    body = {"address": validator.address, "limit": limit, "wait_s": wait_s}
    return signed_post(served.url, "/v1/validation/claim", validator, served.audience, body).json()


def _accept(served: Served, validator: LocalAccount, claims: list[dict]) -> list[str]:
    """Accept each claimed review; their submissions, in the order drawn."""
    for c in claims:
        verdict = verdict_body(served.audience, validator, c, checks_for("accept"))
        assert signed_post(served.url, "/v1/validation/verdicts", validator, served.audience, verdict).status_code == 200
    return [c["submission_id"] for c in claims]


def _ids(claims: list[dict]) -> list[str]:
    return [c["submission_id"] for c in claims]


def test_newcomers_files_wait_behind_proven_nodes_work_for_a_bounded_time(sqlite_url: str, tmp_path: Path) -> None:
    clock, validator = MovableClock(), Account.create()
    with _reviewing(_settings(sqlite_url, tmp_path), validator, clock=clock) as served:

        def submit(node: LocalAccount) -> str:
            return _submit(served, node)

        def claim(limit: int) -> list[str]:
            return _accept(served, validator, _claim(served, validator, limit))

        proven = joined(served)
        first = submit(proven)
        assert claim(1) == [first]  # accepted: the node has a record now
        newcomers = [submit(joined(served)) for _ in range(3)]
        clock.advance(1)
        honest = [submit(proven), submit(proven)]
        # The newest files, yet first: their node has a record. A newcomer's file comes alone, never in a batch
        # that a validator sits on while proven nodes' work arrives.
        assert claim(3) == honest
        assert claim(3) == [newcomers[0]]
        clock.advance(NEWCOMER_WAIT_S)
        later = submit(proven)
        # Past the wait, the newcomers' files are drawn like anyone's, the oldest first, but still one a claim.
        assert claim(4) == [newcomers[1], later]
        assert claim(4) == [newcomers[2]]


def test_newcomers_files_are_handed_at_the_set_rate_and_proven_work_meanwhile(sqlite_url: str, tmp_path: Path) -> None:
    """However many fresh wallets upload, validators are handed their files at ``newcomer_reviews_per_s`` at most (here
    one a second, by the coordinator's clock), in order of arrival; a proven node's work is handed between them."""
    clock, validator = MovableClock(), Account.create()
    settings = _settings(sqlite_url, tmp_path).model_copy(update={"newcomer_reviews_per_s": 1.0})
    with _reviewing(settings, validator, clock=clock) as served:

        def submit(node: LocalAccount) -> str:
            return _submit(served, node)

        def claim() -> list[str]:
            return _accept(served, validator, _claim(served, validator))

        proven = joined(served)
        first = submit(proven)
        assert claim() == [first]  # a newcomer's file too, then: the one turn of this second
        clock.advance(1)
        newcomers = [submit(joined(served)) for _ in range(3)]
        assert claim() == [newcomers[0]]
        assert claim() == []  # held back: the next turn is a second away
        honest = submit(proven)
        assert claim() == [honest]
        clock.advance(0.5)
        assert claim() == []
        clock.advance(0.5)
        later = submit(proven)
        assert claim() == [later]  # the newcomer's file waits behind it, and its turn is not spent meanwhile
        assert claim() == [newcomers[1]]
        clock.advance(5)  # turns do not pile up past one second's worth
        assert claim() == [newcomers[2]]
        assert claim() == []


def test_a_validator_checking_a_newcomers_file_draws_nothing_ahead(sqlite_url: str, tmp_path: Path) -> None:
    """A file drawn ahead while a newcomer's is checked would hold up a proven node's file that arrives meanwhile."""
    key = Account.create()
    with _reviewing(_settings(sqlite_url, tmp_path), key) as served:
        checker = Validator(served.url, key, tmp_path / "validator", Console(quiet=True), batch=4)

        def submit(node: LocalAccount) -> str:
            return _submit(served, node)

        proven = joined(served)
        submit(proven)
        assert checker.run(max_submissions=1) == 1  # accepted: the node has a record now
        newcomers = [submit(joined(served)) for _ in range(2)]
        checked, arrived = [], []
        check = checker.check

        def checking(claim: Claim) -> PublicReceipt:
            if not checked:
                arrived.append(submit(proven))
            checked.append(claim.submission_id)
            return check(claim)

        checker.check = checking  # type: ignore[method-assign]
        checker.run(max_submissions=checker.checked + 2)
        assert checked == [newcomers[0], arrived[0]]


def test_a_validator_stopped_while_it_claims_checks_nothing_more_and_its_claims_go_back_to_the_queue(
    sqlite_url: str, tmp_path: Path
) -> None:
    """A verdict can no longer be posted once stopped, so a batch drawn as the stop comes is not checked for nothing."""
    key, clock, out = Account.create(), MovableClock(), io.StringIO()
    settings = _settings(sqlite_url, tmp_path)
    with _reviewing(settings, key, clock=clock) as served:
        stop = threading.Event()
        checker = Validator(served.url, key, tmp_path / "validator", Console(file=out, width=300), batch=3, stop=stop)
        node = joined(served)
        _submit(served, node)
        assert checker.run(max_submissions=1) == 1  # accepted: the node's next files come three to a claim
        files = [_submit(served, node) for _ in range(3)]
        claim, checked = checker._claim, []

        def stopped_while_claiming(most: int | None = None) -> list[Claim]:
            claims = claim(most)
            stop.set()  # Ctrl-C while the claim's long poll waits
            return claims

        checker._claim = stopped_while_claiming  # type: ignore[method-assign]
        check = checker.check
        checker.check = lambda c: checked.append(c.submission_id) or check(c)  # type: ignore[method-assign,func-returns-value]
        checker.run()
        checker.close()
        assert checked == [] and "3 claimed file(s) left unchecked" in out.getvalue(), out.getvalue()

        clock.advance(settings.committee.validation_claim_s + 1)  # the claims left lapse: nothing is lost
        again = Validator(served.url, key, tmp_path / "validator", Console(quiet=True), batch=3)
        check = again.check
        again.check = lambda c: checked.append(c.submission_id) or check(c)  # type: ignore[method-assign,func-returns-value]
        try:
            assert again.run(max_submissions=3) == 3
        finally:
            again.close()
        assert sorted(checked) == sorted(files)


def test_a_validator_that_hangs_up_mid_wait_is_drawn_nothing_that_arrives_after(sqlite_url: str, tmp_path: Path) -> None:
    """A stopped validator's long poll must not take the next file: it would wait out a claim nobody answers."""
    key = Account.create()
    with _reviewing(_settings(sqlite_url, tmp_path), key) as served:
        body = {"address": key.address, "limit": 4, "wait_s": 10}
        with hung_up(served.url, "/v1/validation/claim", key, served.audience, body):
            time.sleep(0.5)  # its first look found nothing: it waits
        arrived = _submit(served, joined(served))
        time.sleep(1.0)  # what a long poll still waiting would draw at once, on the upload's wake-up
        drawn = signed_post(served.url, "/v1/validation/claim", key, served.audience, {"address": key.address, "limit": 4})
        assert [c["submission_id"] for c in drawn.json()] == [arrived], drawn.text


def test_a_share_of_the_validators_checks_newcomers_files_and_the_others_stay_free_for_proven_work(
    sqlite_url: str, tmp_path: Path
) -> None:
    """Round four's sybil flood: fresh wallets' files and appeals must not occupy every validator. Of two live
    validators one at a time checks them (``unproven_share``: a third, at least one). Links decide who may judge
    whose file, so every draw here is forced."""
    a, b, proven = Account.create(), Account.create(), Account.create()
    for_b = [Account.create() for _ in range(2)]  # linked to A: only B may judge their files
    for_a = [Account.create() for _ in range(2)]
    linked = [[a.address, *(n.address for n in for_b)], [b.address, proven.address, *(n.address for n in for_a)]]
    clock = MovableClock()
    with _reviewing(_settings(sqlite_url, tmp_path, linked), a, b, clock=clock) as served:

        def submit(node: LocalAccount) -> str:
            return _submit(served, node)

        def claim(validator: LocalAccount) -> list[dict]:
            return _claim(served, validator)

        def accept(validator: LocalAccount, claims: list[dict]) -> list[str]:
            return _accept(served, validator, claims)

        assert claim(b) == []  # live: drawn for from now on
        for node in (proven, *for_a, *for_b):
            joined(served, node)
        first = submit(proven)
        assert accept(a, claim(a)) == [first]  # the node has a record now

        b_first, a_first = submit(for_b[0]), submit(for_a[0])
        held = claim(b)
        assert _ids(held) == [b_first]
        # B checks a newcomer's file, so A is kept for proven work, though a newcomer's file is drawn for it.
        assert claim(a) == []
        honest = submit(proven)
        assert accept(a, claim(a)) == [honest]
        accept(b, held)
        assert accept(a, claim(a)) == [a_first]

        # A validator that sits on a newcomer's file keeps the others off them for NEWCOMER_WAIT_S at most.
        b_second, a_second = submit(for_b[1]), submit(for_a[1])
        assert _ids(claim(b)) == [b_second]
        assert claim(a) == []
        clock.advance(NEWCOMER_WAIT_S + 1)
        assert accept(a, claim(a)) == [a_second]


def test_a_validator_no_longer_live_keeps_nobody_off_newcomers_files(sqlite_url: str, tmp_path: Path) -> None:
    """A validator that stops asking for work while it holds a newcomer's file must not keep the live ones off
    newcomers' files, not even for the time a slow check is allowed."""
    a, b, for_b, for_a = (Account.create() for _ in range(4))  # only B may judge for_b's files, only A for_a's
    clock = MovableClock()
    settings = _settings(sqlite_url, tmp_path, [[a.address, for_b.address], [b.address, for_a.address]])
    with _reviewing(settings.model_copy(update={"validator_live_s": 10.0}), a, b, clock=clock) as served:

        def claim(validator: LocalAccount) -> list[str]:
            return _ids(_claim(served, validator))

        assert claim(a) == claim(b) == []  # both live
        b_file, a_file = _submit(served, joined(served, for_b)), _submit(served, joined(served, for_a))
        assert claim(b) == [b_file]
        assert claim(a) == []  # B checks a newcomer's file: A is kept for proven work
        clock.advance(11)  # B has not asked for work since: no longer live, though its claim is recent
        assert claim(a) == [a_file]


def test_a_validator_kept_off_newcomers_files_is_not_woken_for_one(
    sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Work is drawn for a validator as it arrives and wakes its long poll, but not work it may not take now: a look
    for nothing, at every sybil's upload, is what made the coordinator the bottleneck of round four's flood."""
    a, b = Account.create(), Account.create()
    for_a, for_b = Account.create(), Account.create()  # linked to B, to A: only A, only B may judge their files
    looks: list[str] = []
    draw = validation.draw
    monkeypatch.setattr(validation, "draw", lambda *args: looks.append(args[1]) or draw(*args))
    monkeypatch.setattr(validation_router, "POLL_S", 60.0)  # no look on a timeout
    with _reviewing(_settings(sqlite_url, tmp_path, [[a.address, for_b.address], [b.address, for_a.address]]), a, b) as served:

        def claim(validator: LocalAccount, wait_s: float = 0) -> list[dict]:
            return _claim(served, validator, wait_s=wait_s)

        def submit(node: LocalAccount) -> str:
            return _submit(served, node)

        assert claim(a) == claim(b) == []  # live
        for node in (for_a, for_b):
            joined(served, node)
        checked = submit(for_b)
        assert _ids(claim(b)) == [checked]  # B checks a newcomer's file
        waiting = threading.Thread(target=lambda: looks.append(f"answer {claim(a, wait_s=2)}"))
        waiting.start()
        while looks.count(a.address) < 2:
            time.sleep(0.01)
        submit(for_a)  # drawn for A as it arrives, but A is kept off newcomers' files while B checks one
        waiting.join()
    # A's looks: its first claim's, its wait's first and its last, at the deadline; none for the upload.
    assert looks[-1] == "answer []" and looks.count(a.address) == 3
