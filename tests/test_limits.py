"""Rate limits and body size limits: 429 and 413, with nothing recorded."""

from __future__ import annotations

import socket

import httpx

from intellect_protocol.coordinator.settings import CoordinatorSettings
from tests.conftest import serve
from tests.helpers import HTTP, heartbeat_body, register_body, signed_post

HEARTBEAT = "/v1/nodes/heartbeat"


# Rates of one request per 100 s: a token that came back while a loaded machine sends the burst would
# answer 200 where the test expects 429.


def test_rate_limit_per_address(sqlite_url: str, account) -> None:
    with serve(CoordinatorSettings(database_url=sqlite_url, rate_limit_per_s=0.01, rate_limit_burst=3)) as c:
        assert signed_post(c.url, "/v1/nodes/register", account, c.audience, register_body(account)).status_code == 200
        assert signed_post(c.url, HEARTBEAT, account, c.audience, heartbeat_body(account)).status_code == 200
        assert signed_post(c.url, HEARTBEAT, account, c.audience, heartbeat_body(account)).status_code == 200
        before = c.snapshot()
        refused = signed_post(c.url, HEARTBEAT, account, c.audience, heartbeat_body(account))
        assert refused.status_code == 429
        assert refused.json()["code"] == "rate_limited"
        assert int(refused.headers["retry-after"]) >= 1
        assert c.snapshot() == before
        # Another address has its own bucket.
        from eth_account import Account

        other = Account.create()
        assert signed_post(c.url, "/v1/nodes/register", other, c.audience, register_body(other)).status_code == 200


def test_rate_limit_unsigned_by_ip(sqlite_url: str) -> None:
    with serve(CoordinatorSettings(database_url=sqlite_url, rate_limit_per_s=0.01, rate_limit_burst=2)) as c:
        codes = [HTTP.get(c.url + "/v1/public/status").status_code for _ in range(4)]
        assert codes[:2] == [200, 200]
        assert codes[-1] == 429


def test_public_aggregates_have_a_tighter_allowance_per_ip(sqlite_url: str) -> None:
    settings = CoordinatorSettings(database_url=sqlite_url, aggregate_reads_per_s=0.01, aggregate_reads_burst=3)
    with serve(settings) as c:
        reader = httpx.Client(base_url=c.url, transport=httpx.HTTPTransport(local_address="127.0.0.2"))
        codes = [reader.get(path).status_code for path in ("/v1/public/leaderboard", "/v1/public/validators") * 3]
        assert codes[:3] == [200] * 3 and codes[-1] == 429
        refused = reader.get("/v1/public/leaderboard")
        assert refused.json()["code"] == "rate_limited" and "public aggregates" in refused.json()["message"]
        assert int(refused.headers["retry-after"]) >= 1
        # The reader's other requests, and other readers' aggregates, are not held back by it.
        assert reader.get("/v1/public/status").status_code == 200
        assert HTTP.get(c.url + "/v1/public/leaderboard").status_code == 200


def test_body_too_large(sqlite_url: str, account) -> None:
    with serve(CoordinatorSettings(database_url=sqlite_url, max_body_bytes=2048)) as c:
        before = c.snapshot()
        huge = register_body(account, specs={"cpu_cores": 1, "ram_bytes": 1, "disk_free_bytes": 1, "platform": "x" * 4000})
        response = signed_post(c.url, "/v1/nodes/register", account, c.audience, huge)
        assert response.status_code == 413
        assert response.json()["code"] == "body_too_large"
        assert c.snapshot() == before

        # A chunked body declares no length: it is counted as it arrives.
        def chunks():
            for _ in range(10):
                yield b"x" * 1024

        response = HTTP.post(c.url + "/v1/nodes/register", content=chunks(), headers={"content-type": "application/json"})
        assert response.status_code == 413
        assert c.snapshot() == before


def test_declared_length_lie_is_refused(sqlite_url: str) -> None:
    with serve(CoordinatorSettings(database_url=sqlite_url, max_body_bytes=2048)) as c:
        host, port = c.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=5) as s:
            s.sendall(b"POST /v1/nodes/register HTTP/1.1\r\nhost: x\r\ncontent-length: 99999999\r\n\r\n")
            reply = s.recv(4096)
        assert reply.startswith(b"HTTP/1.1 413")


def test_a_flood_of_the_leaderboard_page_gets_its_allowance_and_changes_nothing(sqlite_url: str) -> None:
    """The page is rendered on the server from the ledger. A thousand reads from one address, each lying about where
    it comes from (forwarded-for headers) and asking for what the page ignores (query strings), get the allowance
    and then 429 with a reason: nothing changes and no read fails. Another address still has its own allowance."""
    with serve(CoordinatorSettings(database_url=sqlite_url, rate_limit_per_s=0.01, rate_limit_burst=20)) as c:
        before = c.snapshot()
        flooder = httpx.Client(base_url=c.url, transport=httpx.HTTPTransport(local_address="127.0.0.3"))
        replies = [
            flooder.get(
                f"/?run={'x' * (i % 200)}&view=../../etc/passwd",
                headers={"x-forwarded-for": f"10.0.{i // 256}.{i % 256}", "x-real-ip": f"10.1.0.{i % 256}"},
            )
            for i in range(1000)
        ]
        codes = [r.status_code for r in replies]
        assert codes.count(200) == 20 and codes.count(429) == 980, sorted(set(codes))
        assert all(
            r.json()["code"] == "rate_limited" and int(r.headers["retry-after"]) >= 1 for r in replies if r.status_code == 429
        )
        assert all("<html" in r.text.lower() for r in replies if r.status_code == 200)
        assert c.snapshot() == before
        reader = httpx.Client(base_url=c.url, transport=httpx.HTTPTransport(local_address="127.0.0.4"))
        assert reader.get("/").status_code == 200
