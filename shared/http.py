"""An ``httpx`` client for role processes that talk to the coordinator: it rides out a coordinator
restart by retrying requests that could not connect, with backoff.

Only connection failures are retried: such a request never reached the server, so resending it
(same signature, same nonce) cannot apply it twice. A request that reached the server and failed
is the caller's to handle.
"""

from __future__ import annotations

import logging
import threading
import time

import httpx

log = logging.getLogger(__name__)


class RetryConnect(httpx.HTTPTransport):
    def __init__(
        self, give_up_s: float = 240.0, first_wait_s: float = 0.5, max_wait_s: float = 8.0, stop: threading.Event | None = None
    ) -> None:
        """``give_up_s`` stays under the coordinator's signature window (300 s), so a retried
        signed request is still fresh when it finally arrives. Setting ``stop`` ends the waiting at
        once: the connection error is raised, so a role asked to stop does not wait out the backoff."""
        super().__init__()
        self.give_up_s, self.first_wait_s, self.max_wait_s = give_up_s, first_wait_s, max_wait_s
        self.stop = stop or threading.Event()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        deadline = time.monotonic() + self.give_up_s
        wait = self.first_wait_s
        while True:
            try:
                return super().handle_request(request)
            except (httpx.ConnectError, httpx.ConnectTimeout) as e:
                if self.stop.is_set() or time.monotonic() + wait > deadline:
                    raise
                log.warning("cannot reach %s (%s); retrying in %.1f s", request.url.host, e, wait)
                if self.stop.wait(wait):
                    raise
                wait = min(wait * 2, self.max_wait_s)


def get_waiting(http: httpx.Client, path: str, tries: int = 30, stop: threading.Event | None = None, **params: object) -> httpx.Response:
    """GET, waiting out the coordinator's rate limit (429) or a brief unavailability (503) as its
    Retry-After asks (at most 10 s a time); raises :class:`httpx.HTTPStatusError` for any other
    failure, or when it is still unavailable after ``tries`` or once ``stop`` is set."""
    for _ in range(tries - 1):
        reply = http.get(path, params=params or None)
        if reply.status_code not in (429, 503):
            return reply.raise_for_status()
        log.warning("%s answered %d; retrying", path, reply.status_code)
        if (stop or threading.Event()).wait(min(float(reply.headers.get("retry-after", "1")), 10.0)):
            return reply.raise_for_status()
    return http.get(path, params=params or None).raise_for_status()


def coordinator_client(
    base_url: str, timeout: float, auth: httpx.Auth | None = None, stop: threading.Event | None = None
) -> httpx.Client:
    return httpx.Client(base_url=base_url, timeout=timeout, auth=auth, transport=RetryConnect(stop=stop))
