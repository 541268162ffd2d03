"""A transaction PostgreSQL aborts to break a deadlock is run again, not turned into a 500."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import text
from sqlalchemy.orm import Session

from intellect_protocol.coordinator.db import make_engine, make_sessionmaker
from intellect_protocol.coordinator.ledger import Ledger


def test_a_deadlocked_transaction_is_run_again(database_url: str) -> None:
    if not database_url.startswith("postgresql"):
        pytest.skip("SQLite serialises writers: no deadlock to break")
    engine = make_engine(database_url)
    with engine.begin() as connection:
        connection.execute(text("CREATE TABLE probe (id int PRIMARY KEY, hits int NOT NULL)"))
        connection.execute(text("INSERT INTO probe VALUES (1, 0), (2, 0)"))
    ledger = Ledger(make_sessionmaker(engine), threads=0)
    both_hold_one = threading.Barrier(2)
    attempts = {1: 0, 2: 0}

    def cross(session: Session, first: int, second: int) -> None:
        attempts[first] += 1
        session.execute(text("UPDATE probe SET hits = hits + 1 WHERE id = :id"), {"id": first})
        if attempts[first] == 1:
            both_hold_one.wait(10)  # each holds one row and wants the other's: PostgreSQL aborts one
        session.execute(text("UPDATE probe SET hits = hits + 1 WHERE id = :id"), {"id": second})

    failures: list[BaseException] = []

    def run(first: int, second: int) -> None:
        try:
            ledger.run_sync(cross, first, second)
        except BaseException as e:  # noqa: BLE001 - reported below
            failures.append(e)

    threads = [threading.Thread(target=run, args=pair) for pair in ((1, 2), (2, 1))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert failures == []
    # One side was aborted and ran again. Its rerun can race the other side for the freed row and
    # deadlock once more (seen under load: [1, 3]), so count reruns, not their number.
    assert sum(attempts.values()) >= 3
    with engine.connect() as connection:
        assert connection.execute(text("SELECT sum(hits) FROM probe")).scalar() == 4  # each transaction counted once
    engine.dispose()
