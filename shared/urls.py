"""Whether a coordinator URL can ever work: a typo is an error at once, only an unreachable
(but well-formed, resolvable) address is worth retrying."""

from __future__ import annotations

import socket

import httpx


def url_problem(url: str) -> str | None:
    """Why ``url`` can never reach a coordinator, with the likely intended URL; None when it may."""
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as e:
        return f"{url!r} is not a URL ({e})."
    if parsed.scheme not in ("http", "https"):
        guess = url.split("://", 1)[-1].removeprefix("http//").removeprefix("https//")
        return f"{url!r} is not an http:// or https:// URL; did you mean http://{guess}?"
    if not parsed.host:
        return f"{url!r} names no host; e.g. http://127.0.0.1:8000."
    if parsed.port is not None and not 0 < parsed.port < 65536:
        return f"{url!r} has port {parsed.port}, outside 1-65535."
    if "v1" in parsed.path.split("/"):
        # A base behind a proxy's path prefix works; one that points into the API doubles every route's /v1.
        segments = parsed.path.strip("/").split("/")
        path = "/" + "/".join(segments[: segments.index("v1")])
        base = str(parsed.copy_with(path=path, query=None, fragment=None)).rstrip("/")
        return f"{url!r} points into the coordinator's API; give its base URL, {base}, and each command adds the /v1 routes."
    try:
        socket.getaddrinfo(parsed.host, parsed.port or (443 if parsed.scheme == "https" else 80))
    except socket.gaierror as e:
        if e.errno in (socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME)):
            return f"The host {parsed.host!r} of {url!r} does not resolve; check its spelling."
        # EAI_AGAIN and the like: the resolver may be down for a moment, so this is worth retrying.
    return None
