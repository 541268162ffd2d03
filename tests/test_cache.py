"""The coordinator's TTL cache: one computation per key however many ask, failures not kept."""

from __future__ import annotations

import asyncio
import time

import pytest

from intellect_protocol.coordinator.cache import TtlCache

pytestmark = pytest.mark.unit


def test_concurrent_misses_of_one_key_compute_once_and_all_get_the_value() -> None:
    calls = 0

    async def compute() -> int:
        nonlocal calls
        calls += 1
        await asyncio.sleep(0.05)
        return 7

    async def main() -> list[int]:
        cache: TtlCache[str, int] = TtlCache(60)
        return await asyncio.gather(*(cache.get("k", compute) for _ in range(50)))

    assert asyncio.run(main()) == [7] * 50
    assert calls == 1


def test_a_value_expires_after_its_ttl_and_the_ttl_may_depend_on_it() -> None:
    async def main() -> None:
        cache: TtlCache[str, int] = TtlCache(lambda v: 60 if v else 0.05)
        values = iter([0, 5, 9])

        async def compute() -> int:
            return next(values)

        assert await cache.get("a", compute) == 0
        assert cache.fresh("a") == 0
        time.sleep(0.06)
        assert cache.fresh("a") is None and cache.last("a") == 0
        assert await cache.get("a", compute) == 5
        time.sleep(0.06)
        assert await cache.get("a", compute) == 5  # 5 keeps for 60 s

    asyncio.run(main())


def test_a_failure_reaches_every_waiter_and_is_not_kept() -> None:
    attempts = 0

    async def failing() -> int:
        nonlocal attempts
        attempts += 1
        await asyncio.sleep(0.02)
        raise ConnectionError("down")

    async def main() -> None:
        cache: TtlCache[str, int] = TtlCache(60)
        results = await asyncio.gather(*(cache.get("k", failing) for _ in range(5)), return_exceptions=True)
        assert all(isinstance(r, ConnectionError) for r in results) and attempts == 1
        assert cache.last("k") is None

        async def fine() -> int:
            return 3

        assert await cache.get("k", fine) == 3

    asyncio.run(main())


def test_keys_beyond_the_bound_push_out_the_oldest() -> None:
    async def main() -> None:
        cache: TtlCache[int, int] = TtlCache(60, max_keys=3)
        for key in range(5):

            async def compute(key: int = key) -> int:
                return key * 10

            await cache.get(key, compute)
        assert [cache.last(k) for k in range(5)] == [None, None, 20, 30, 40]

    asyncio.run(main())
