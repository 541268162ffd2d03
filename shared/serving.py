"""Serving our HTTP apps to untrusted clients: uvicorn, with bounds on what a connection may cost
before its request ever reaches the app.

uvicorn's httptools parser buffers request headers without a size limit and without a deadline:
fifty connections that never finish their headers stay open indefinitely, uncounted by any
per-client limit (that middleware sees requests, not connections), and a 1 MiB header value is
accepted. :class:`HeaderLimits` closes that gap at the connection:

- headers must be complete within ``timeout_s`` of a request's first byte (else 408, closed);
- the bytes buffered before they are complete stay under ``max_bytes`` (else 431, closed);
- one client IP holds at most ``connections_per_ip`` connections (the next is answered 429, closed).

Behind a reverse proxy, that proxy's own limits apply first (nginx: ``client_header_timeout``,
``large_client_header_buffers``); these still bound what reaches the process directly.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
from collections import Counter
from dataclasses import dataclass

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from intellect_protocol.shared.interpreter import pin_recursion_limit


@dataclass(frozen=True)
class HeaderLimits:
    timeout_s: float = 10.0
    """Longest a request's headers may take to arrive, from its first byte."""
    max_bytes: int = 32 << 10
    """Most bytes a request's line and headers may take."""
    connections_per_ip: int = 256
    """Most open connections from one client IP."""


def _answer(status: bytes) -> bytes:
    return b"HTTP/1.1 " + status + b"\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"


def guarded_protocol(limits: HeaderLimits) -> type[HttpToolsProtocol]:
    """An httptools protocol class holding to ``limits``; its connection count is its own, per server."""
    open_per_ip: Counter[str] = Counter()

    class Guarded(HttpToolsProtocol):
        _timer: asyncio.TimerHandle | None = None
        _awaiting_headers = True
        _header_bytes = 0
        _ip: str | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            ip = self.client[0] if self.client else "unknown"
            if open_per_ip[ip] >= limits.connections_per_ip:
                self._close(b"429 Too Many Requests")
                return
            self._ip = ip
            open_per_ip[ip] += 1
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            if self._ip is not None:
                open_per_ip[self._ip] -= 1
                if not open_per_ip[self._ip]:
                    del open_per_ip[self._ip]
                self._ip = None
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            awaiting = self._awaiting_headers
            super().data_received(data)
            if awaiting and self._awaiting_headers:  # the headers are still incomplete after this part
                self._header_bytes += len(data)
                if self._header_bytes > limits.max_bytes:
                    self._close(b"431 Request Header Fields Too Large")

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._awaiting_headers, self._header_bytes = True, 0
            self._arm()

        def on_headers_complete(self) -> None:
            self._awaiting_headers = False
            self._disarm()
            super().on_headers_complete()

        def _arm(self) -> None:
            if self._timer is None:
                self._timer = self.loop.call_later(limits.timeout_s, self._close, b"408 Request Timeout")

        def _disarm(self) -> None:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

        def _close(self, status: bytes) -> None:
            self._disarm()
            if not self.transport.is_closing():
                self.transport.write(_answer(status))
                self.transport.close()

    return Guarded


class _ShutdownNotice(logging.Filter):
    """uvicorn says "Cancel N running task(s), timeout graceful shutdown exceeded" at ERROR whenever connections
    outlive the 5 s a stop allows, even when N is 0: nothing was cut then, so the line is dropped; otherwise it is
    said for what it is (long polls and uploads cut by a stop, which their clients send again)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if not message.startswith("Cancel ") or "timeout graceful shutdown exceeded" not in message:
            return True
        if message.startswith("Cancel 0 "):
            return False
        record.levelno, record.levelname = logging.WARNING, "WARNING"
        record.msg, record.args = (
            f"{message.split(',')[0]} still open 5 s into the stop (long polls or uploads; clients retry)",
            (),
        )
        return True


logging.getLogger("uvicorn.error").addFilter(_ShutdownNotice())


def server_config(
    app: object,
    host: str,
    port: int,
    limits: HeaderLimits | None = None,
    *,
    tls: dict[str, str] | None = None,
    **options: object,
) -> uvicorn.Config:
    """uvicorn's config for ``app`` with the header guard; checks the recursion limit as the server
    starts. On SIGTERM, requests still open after 5 s (long polls) are cut, so a stop is prompt.
    ``tls``: the certificate options of :func:`shared.tls.server_tls` (HTTPS), none for plain HTTP."""
    pin_recursion_limit()
    options.setdefault("timeout_graceful_shutdown", 5)
    options.update(tls or {})
    return uvicorn.Config(app, host=host, port=port, http=guarded_protocol(limits or HeaderLimits()), **options)  # type: ignore[arg-type]


def listen(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port``, bound before the app starts so a busy port fails first
    with a message saying what to do (:class:`OSError`), not after "startup complete"."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            raise OSError(
                e.errno, f"Port {port} on {host} is in use (another coordinator?): stop it, or choose another with --port."
            ) from None
        raise OSError(e.errno, f"Cannot listen on {host}:{port}: {e.strerror}.") from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock
