"""Bound what one request may cost before a handler sees it: its body's size (413), the time its
body takes to arrive (408), and how many requests one client IP has in flight (429); bound what
all bodies being received at once may hold in memory (503 past the budget); and refuse NUL
characters in URLs and JSON bodies (422), which PostgreSQL cannot store in text.

Rollout uploads are outside the memory budget: their bodies go to disk as they arrive, a mebibyte at a
time, and only for a signer verified from the headers, within its own share (:func:`coordinator.deps.signed_upload`).
Counted at their declared size, a stranger holding the budget with slow JSON bodies had every node's upload
refused until its lease ran out."""

from __future__ import annotations

import asyncio
from collections import Counter

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from intellect_protocol.coordinator.errors import error_response
from intellect_protocol.coordinator.media import is_json
from intellect_protocol.shared.schemas import ErrorCode


class _Refused(Exception):
    pass


class BodyLimitMiddleware:
    def __init__(
        self,
        app: ASGIApp,
        max_bytes: int,
        overrides: dict[str, int] | None = None,
        idle_timeout_s: float = 15.0,
        deadline_s: float = 120.0,
        budget_bytes: int | None = None,
    ) -> None:
        """``overrides``: a different size limit for the exact paths named (rollout uploads), whose bodies
        are streamed to disk and so are not counted in the budget. ``budget_bytes``: most body bytes
        admitted at once over all other requests, each counted at its declared length (a chunked body
        at its path's limit) from arrival until its answer."""
        self.app = app
        self.max_bytes = max_bytes
        self.overrides = overrides or {}
        self.idle_timeout_s = idle_timeout_s
        self.deadline_s = deadline_s
        self.budget_bytes = budget_bytes
        self.admitted_bytes = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.overrides.get(scope["path"], self.max_bytes)
        if b"%00" in scope.get("raw_path", b"") or b"%00" in scope.get("query_string", b"") or "\x00" in scope["path"]:
            await _refuse(scope, send, ErrorCode.validation_error, "The URL holds a NUL character.")
            return
        headers = dict(scope["headers"])
        json_body = is_json(headers.get(b"content-type"))
        declared = headers.get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > limit):
            await _refuse(scope, send, ErrorCode.body_too_large, f"The request body is larger than {limit} bytes.")
            return

        chunked = b"chunked" in headers.get(b"transfer-encoding", b"")
        reserve = 0 if scope["path"] in self.overrides else int(declared) if declared is not None else limit if chunked else 0
        if self.budget_bytes is not None and reserve and self.admitted_bytes + reserve > self.budget_bytes:
            message = "The coordinator is receiving as much as it holds at once; retry shortly."
            await _refuse(scope, send, ErrorCode.overloaded, message, headers={"Retry-After": "2"})
            return
        self.admitted_bytes += reserve
        try:
            await self._limited(scope, receive, send, limit, json_body)
        finally:
            self.admitted_bytes -= reserve

    async def _limited(self, scope: Scope, receive: Receive, send: Send, limit: int, json_body: bool) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.deadline_s
        received = 0
        tail = b""  # the end of the previous part, so an escape split between two parts is still seen
        started = refused = body_done = False

        async def limited_receive() -> Message:
            nonlocal received, refused, body_done, tail
            if body_done:  # later reads only wait for the client to disconnect: no deadline on those
                return await receive()
            wait = min(self.idle_timeout_s, deadline - loop.time())
            try:
                message = await asyncio.wait_for(receive(), timeout=max(wait, 0.001))
            except TimeoutError:
                if started:  # the handler answered without reading the whole body: treat the sender as gone
                    return {"type": "http.disconnect"}
                refused = True
                await _refuse(scope, send, ErrorCode.request_timeout, "The request body arrived too slowly.", close=True)
                raise _Refused from None
            body_done = message["type"] != "http.request" or not message.get("more_body", False)
            if message["type"] == "http.request":
                part = message.get("body", b"")
                received += len(part)
                escaped_nul = json_body and (b"\\u0000" in part or b"\\u0000" in tail + part[:5])
                tail = part[-5:]
                if escaped_nul and not started:
                    refused = True
                    await _refuse(scope, send, ErrorCode.validation_error, "The JSON body holds a NUL character.")
                    raise _Refused
                if received > limit and not started:
                    # Answer now: the framework would turn an exception from here into a 400.
                    refused = True
                    await _refuse(scope, send, ErrorCode.body_too_large, f"The request body is larger than {limit} bytes.")
                    raise _Refused
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal started
            if refused:
                return
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited_receive, guarded_send)
        except _Refused:
            pass


class PerClientLimitMiddleware:
    """At most ``max_in_flight`` requests per client IP at once; the rest get 429 at once."""

    def __init__(self, app: ASGIApp, max_in_flight: int) -> None:
        self.app = app
        self.max_in_flight = max_in_flight
        self.in_flight: Counter[str] = Counter()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        client = scope["client"][0] if scope.get("client") else "unknown"
        if self.in_flight[client] >= self.max_in_flight:
            message = f"This address already has {self.max_in_flight} requests in flight; retry when they finish."
            await _refuse(scope, send, ErrorCode.rate_limited, message, headers={"Retry-After": "1"})
            return
        self.in_flight[client] += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight[client] -= 1
            if not self.in_flight[client]:
                del self.in_flight[client]


async def _refuse(
    scope: Scope,
    send: Send,
    code: ErrorCode,
    message: str,
    close: bool = False,
    headers: dict[str, str] | None = None,
) -> None:
    headers = {**(headers or {}), **({"connection": "close"} if close else {})}
    response = error_response(code, message, headers=headers or None)

    async def no_body() -> Message:
        return {"type": "http.disconnect"}

    await response(scope, no_body, send)
