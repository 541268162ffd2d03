"""Structured logs: one JSON object per line, for every long-running role."""

from __future__ import annotations

import json
import logging
import time

_STANDARD = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime", "taskName"}
"""The attributes every record has; anything else on a record came from the call's ``extra``."""


class JsonFormatter(logging.Formatter):
    """A record as one JSON object: time, level, logger, message, the exception if any, and every field the
    call passed in ``extra`` (values JSON cannot hold are written as their ``str``)."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": round(record.created, 3),
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        entry |= {key: value for key, value in record.__dict__.items() if key not in _STANDARD and key not in entry}
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def configure(level: str = "info") -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter())
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
