"""uvicorn's stop notice says what happened: nothing when no request was cut, a warning saying why when some were."""

from __future__ import annotations

import logging

import pytest

import intellect_protocol.shared.serving  # noqa: F401  (installs the notice's filter)

pytestmark = pytest.mark.unit


def test_a_stop_that_cut_nothing_says_nothing_and_one_that_cut_requests_says_why(caplog: pytest.LogCaptureFixture) -> None:
    log = logging.getLogger("uvicorn.error")
    log.addHandler(caplog.handler)  # uvicorn's own logging config stops its records short of the root logger
    try:
        for tasks in (0, 3):
            log.error("Cancel %s running task(s), timeout graceful shutdown exceeded", tasks)
        log.error("Exception in ASGI application")
    finally:
        log.removeHandler(caplog.handler)
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("WARNING", "Cancel 3 running task(s) still open 5 s into the stop (long polls or uploads; clients retry)"),
        ("ERROR", "Exception in ASGI application"),
    ]
