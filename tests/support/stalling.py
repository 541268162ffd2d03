"""A loopback HTTP server in front of a real coordinator that forwards every request as it came, but holds those to
one path unanswered: a long poll that never ends, the point where a stop must not wait for the coordinator."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tests.helpers import HTTP

HOP_BY_HOP = {"host", "content-length", "connection", "transfer-encoding", "keep-alive"}


@contextmanager
def stalling(target: str, path: str) -> Iterator[tuple[str, threading.Event]]:
    """The proxy's URL, and an event set once a request to ``path`` is being held (until the proxy closes)."""
    held, closing = threading.Event(), threading.Event()

    class Forward(BaseHTTPRequestHandler):
        def _forward(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length") or 0))
            if self.path.split("?")[0] == path:
                held.set()
                closing.wait()
                return
            headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
            reply = HTTP.request(self.command, target + self.path, content=body, headers=headers, timeout=60)
            self.send_response(reply.status_code)
            for k, v in reply.headers.items():
                if k.lower() not in HOP_BY_HOP and k.lower() != "content-encoding":
                    self.send_header(k, v)
            self.send_header("content-length", str(len(reply.content)))
            self.end_headers()
            self.wfile.write(reply.content)

        do_GET = do_POST = _forward

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Forward)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}", held
    finally:
        closing.set()
        server.shutdown()
        server.server_close()
