"""Structured logs keep what a call passes in ``extra``."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from intellect_protocol.shared.logs import JsonFormatter

pytestmark = pytest.mark.unit


def _line(**kwargs: object) -> dict[str, object]:
    record = logging.getLogger("intellect.test").makeRecord(
        "intellect.test", logging.WARNING, "f.py", 3, "lease %s lost", ("t1",), None, **kwargs
    )
    return dict(json.loads(JsonFormatter().format(record)))


def test_a_line_holds_the_extra_fields_of_its_call() -> None:
    line = _line(extra={"task_id": "t1", "attempt": 2, "path": Path("/tmp/x")})
    assert line["message"] == "lease t1 lost" and line["level"] == "warning" and line["logger"] == "intellect.test"
    assert (line["task_id"], line["attempt"], line["path"]) == ("t1", 2, "/tmp/x")


def test_a_line_without_extra_holds_only_the_standard_fields() -> None:
    assert set(_line()) == {"ts", "time", "level", "logger", "message"}
