"""How the coordinator's client (:mod:`shared.coordinator_client`) says a request failed, and how it reads a refusal."""

from __future__ import annotations

from typing import Any

import httpx


class ProtocolError(Exception):
    """The coordinator did not do what was asked."""


class Refused(ProtocolError):
    """The coordinator answered 4xx (other than 429): resending the same request cannot help."""

    def __init__(self, status: int, code: str | None, message: str, details: dict[str, Any]) -> None:
        super().__init__(f"HTTP {status} {code or ''}: {message}".replace("  ", " "))
        self.status, self.code, self.message, self.details = status, code, message, details


class Unavailable(ProtocolError):
    """No answer (or only 429/5xx) for ``give_up_s``."""


class Stopped(ProtocolError):
    """``stop`` was set while the client waited to send again."""


def refused(reply: httpx.Response) -> Refused:
    try:
        payload = reply.json()
        return Refused(reply.status_code, payload.get("code"), payload.get("message", ""), payload.get("details") or {})
    except (ValueError, AttributeError):
        return Refused(reply.status_code, None, reply.text[:200], {})


def overloaded(reply: httpx.Response) -> str:
    if reply.status_code == 429:
        return "the coordinator asks us to slow down (429)"
    try:
        message = reply.json().get("message")
    except (ValueError, AttributeError):
        message = None
    return f"the coordinator answered HTTP {reply.status_code}" + (f" ({message})" if message else "")


def retry_after(reply: httpx.Response) -> float | None:
    value = reply.headers.get("retry-after", "")
    try:
        return max(0.0, float(value))
    except ValueError:
        return None
