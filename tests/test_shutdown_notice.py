"""uvicorn's stop notice says what happened: nothing when no request was cut, a warning saying why when some were."""

from __future__ import annotations

import logging

import pytest

import intellect_protocol.shared.serving  # noqa: F401  (installs the notice's filter)

pytestmark = pytest.mark.unit


class _Kept(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_a_stop_that_cut_nothing_says_nothing_and_one_that_cut_requests_says_why() -> None:
    log, kept = logging.getLogger("uvicorn.error"), _Kept()
    propagate, level = log.propagate, log.level
    log.addHandler(kept)
    log.propagate, log.level = False, logging.INFO  # only this handler, whatever logging uvicorn set up before
    try:
        for tasks in (0, 3):
            log.error("Cancel %s running task(s), timeout graceful shutdown exceeded", tasks)
        log.error("Exception in ASGI application")
    finally:
        log.removeHandler(kept)
        log.propagate, log.level = propagate, level
    assert [(r.levelname, r.getMessage()) for r in kept.records] == [
        ("WARNING", "Cancel 3 running task(s) still open 5 s into the stop (long polls or uploads; clients retry)"),
        ("ERROR", "Exception in ASGI application"),
    ]
