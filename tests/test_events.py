"""The coordinator logs a ledger event only once its transaction commits."""

from __future__ import annotations

import logging

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.orm import Session

from intellect_protocol.coordinator.events import after_commit


def test_an_event_is_logged_on_commit_only(caplog: pytest.LogCaptureFixture) -> None:
    engine = create_engine("sqlite://")
    caplog.set_level(logging.INFO, logger="intellect.coordinator")
    with Session(engine) as session:
        session.execute(text("SELECT 1"))  # a transaction, as every service call runs in
        after_commit(session, "node %s banned: %s", "0xabc", "aborted")
        session.rollback()  # the database aborted it: it may run again, and must not log twice
        session.execute(text("SELECT 1"))
        after_commit(session, "node %s banned: %s", "0xabc", "strikes")
        assert caplog.messages == []  # not before the commit
        session.commit()
        session.commit()  # nothing left to log
    assert caplog.messages == ["node 0xabc banned: strikes"]
