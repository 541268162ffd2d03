"""Building blocks for tests that speak the node protocol by hand."""

from __future__ import annotations

import json
from typing import Any

import httpx
from eth_account.signers.local import LocalAccount

from shared.signing import sign_request
from shared.version import __version__

SPECS = {"cpu_cores": 2, "ram_bytes": 8 << 30, "disk_free_bytes": 100 << 30}


def register_body(account: LocalAccount, **overrides: Any) -> dict[str, Any]:
    return {"address": account.address, "specs": SPECS, "client_version": __version__, **overrides}


def heartbeat_body(account: LocalAccount, **overrides: Any) -> dict[str, Any]:
    return {"address": account.address, "client_version": __version__, "activity": "idle", "metrics": {}, **overrides}


def signed_post(
    url: str,
    path: str,
    account: LocalAccount,
    audience: str,
    body: dict[str, Any] | bytes,
    *,
    query: str = "",
    timestamp: int | None = None,
    nonce: str | None = None,
    headers: dict[str, str] | None = None,
) -> httpx.Response:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    signed = sign_request(account, "POST", path, query, raw, audience, timestamp=timestamp, nonce=nonce)
    full_path = f"{path}?{query}" if query else path
    return httpx.post(url + full_path, content=raw, headers={"content-type": "application/json", **signed, **(headers or {})})
