"""Trimming a request stream (queue_adapters/stream_trim.py) on a real Redis: what every group has read
and acknowledged goes; a pending entry, anything after it, and anything unread stay; a stream that no
group reads is left alone."""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis

from queue_adapters.stream_trim import safe_trim_point, trim_acknowledged

pytestmark = pytest.mark.redis


async def _stream(redis, key: str, count: int) -> list[bytes]:
    return [await redis.xadd(key, {"data": str(index)}) for index in range(count)]


async def test_read_and_acknowledged_entries_go_pending_and_unread_ones_stay(redis_url, prefix):
    redis = aioredis.from_url(redis_url)
    key = f"{prefix}:requests"
    ids = await _stream(redis, key, 30)
    await redis.xgroup_create(key, "workers", id="0")
    read = [entry_id for entry_id, _ in (await redis.xreadgroup("workers", "w0", {key: ">"}, count=20))[0][1]]
    await redis.xack(key, "workers", *read[:8], *read[9:])  # read[8] still being served
    assert await trim_acknowledged(redis, key) == 8
    assert [entry_id for entry_id, _ in await redis.xrange(key)] == ids[8:]  # the pending one and after
    await redis.xack(key, "workers", read[8])
    assert await trim_acknowledged(redis, key) == 12
    assert [entry_id for entry_id, _ in await redis.xrange(key)] == ids[20:]  # never read: kept
    await redis.aclose()


async def test_the_slowest_group_decides(redis_url, prefix):
    redis = aioredis.from_url(redis_url)
    key = f"{prefix}:requests"
    ids = await _stream(redis, key, 10)
    for group, count in (("fast", 10), ("slow", 3)):
        await redis.xgroup_create(key, group, id="0")
        entries = (await redis.xreadgroup(group, "c", {key: ">"}, count=count))[0][1]
        await redis.xack(key, group, *[entry_id for entry_id, _ in entries])
    assert await trim_acknowledged(redis, key) == 3  # up to slow's last delivered and acked (ids[2])
    assert (await redis.xrange(key, count=1))[0][0] == ids[3]
    await redis.aclose()


async def test_streams_no_group_reads_and_missing_streams_are_left_alone(redis_url, prefix):
    redis = aioredis.from_url(redis_url)
    key = f"{prefix}:unread"
    await _stream(redis, key, 5)
    assert await safe_trim_point(redis, key) is None
    assert await trim_acknowledged(redis, key) == 0 and await redis.xlen(key) == 5
    assert await trim_acknowledged(redis, f"{prefix}:missing") == 0
    await redis.aclose()
