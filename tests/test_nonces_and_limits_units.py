"""The replay guard's retention and the token buckets, on their own."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import func, select

from intellect_protocol.coordinator.db import make_engine, make_sessionmaker
from intellect_protocol.coordinator.errors import ApiError
from intellect_protocol.coordinator.models import Nonce
from intellect_protocol.coordinator.services.nonces import prune_nonces, record_nonce
from intellect_protocol.coordinator.services.rate_limit import RateLimiter
from intellect_protocol.coordinator.settings import CoordinatorSettings


def test_nonces_kept_at_least_twice_the_window(database_url: str) -> None:
    settings = CoordinatorSettings(database_url=database_url, signature_window_s=300, nonce_retention_s=60)
    assert settings.nonce_keep_s == 600
    sessions = make_sessionmaker(make_engine(database_url))
    now = datetime.now(UTC)
    with sessions.begin() as session:
        record_nonce(session, "0xabc", "a" * 32, now - timedelta(seconds=601))
        record_nonce(session, "0xabc", "b" * 32, now - timedelta(seconds=599))
    with sessions.begin() as session:
        assert prune_nonces(session, now, settings.nonce_keep_s) == 1
        assert session.scalar(select(func.count()).select_from(Nonce)) == 1
    with sessions.begin() as session, pytest.raises(ApiError) as refused:
        record_nonce(session, "0xabc", "b" * 32, now)
    assert refused.value.code == "nonce_reused"
    with sessions.begin() as session:
        record_nonce(session, "0xdef", "b" * 32, now)  # nonces are per address


def test_token_bucket() -> None:
    limiter = RateLimiter(rate_per_s=2, burst=3, max_keys=2)
    assert [limiter.acquire("a", now=0.0) for _ in range(3)] == [0, 0, 0]
    assert limiter.acquire("a", now=0.0) == pytest.approx(0.5)
    assert limiter.acquire("a", now=0.5) == 0  # refilled one token
    assert limiter.acquire("b", now=0.5) == 0
    limiter.acquire("c", now=0.5)  # evicts the least recently used key, "a"
    assert limiter.acquire("a", now=0.5) == 0  # a fresh, full bucket
