"""The response stores' bounds, in memory and on the real Redis: a tenant's oldest records go first past its
count or bytes, records expire, one tenant never reads or deletes another's, and the memory store's total
stays bounded whatever the number of tenants."""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis

from actors.http.responses.redis_store import RedisResponseStore
from actors.http.responses.store import MemoryResponseStore, ResponseStore, StoreLimits

LIMITS = StoreLimits(ttl_s=60, max_responses=3, max_bytes=100, max_total_bytes=150)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def _known(store: ResponseStore, tenant: str, ids: list[str]) -> list[str]:
    return [response_id for response_id in ids if await store.load(tenant, response_id) is not None]


async def _bounds_hold(store: ResponseStore) -> None:
    for index in range(5):
        await store.save("a", f"r{index}", "x" * 10)
    assert await _known(store, "a", [f"r{index}" for index in range(5)]) == ["r2", "r3", "r4"]  # at most 3
    await store.save("a", "big", "y" * 85)
    assert await _known(store, "a", ["r2", "r3", "r4", "big"]) == ["r4", "big"]  # at most 100 bytes
    assert await store.load("b", "big") is None and not await store.delete("b", "big")  # another tenant's
    assert await store.delete("a", "big") and await store.load("a", "big") is None


async def test_the_memory_store_evicts_a_tenant_s_oldest_and_keeps_tenants_apart() -> None:
    await _bounds_hold(MemoryResponseStore(LIMITS))


async def test_the_memory_store_forgets_expired_records_and_bounds_all_tenants_together() -> None:
    clock = Clock()
    store = MemoryResponseStore(LIMITS, clock)
    await store.save("a", "old", "x" * 10)
    clock.now += 61
    assert await store.load("a", "old") is None
    for tenant in "bcd":
        await store.save(tenant, tenant, "z" * 60)
    assert [await store.load(tenant, tenant) is not None for tenant in "bcd"] == [False, True, True]  # 150 bytes


@pytest.mark.redis
async def test_the_redis_store_keeps_the_same_bounds_for_every_gateway(redis_url: str, prefix: str) -> None:
    client = aioredis.Redis.from_url(redis_url)
    try:
        store = RedisResponseStore(client, prefix, LIMITS)
        # Redis counts the tenant's name kept with each record: 2 more bytes a record here
        await _bounds_hold(RedisResponseStore(client, prefix, StoreLimits(ttl_s=60, max_responses=3, max_bytes=106)))
        await store.save("c", "kept", "x")
        assert 0 < await client.ttl(f"{prefix}:resp:kept") <= 60
        assert await client.ttl(f"{prefix}:resp-index:c") > 0
        assert await RedisResponseStore(client, prefix, LIMITS).load("c", "kept") == "x"  # another gateway's store
    finally:
        await client.aclose()
