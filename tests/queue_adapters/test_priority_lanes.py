"""Priority lanes against a real Redis: a request is queued on its priority's stream, and a worker's
read takes the most urgent lane first, leaves each less urgent lane a share, and blocks on all."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis

from queue_adapters.client import AqueductClient
from queue_adapters.codec import WireRequest, decode_request
from queue_adapters.priority_lanes import LANES, LanedConsumer, lane_key, request_key
from queue_adapters.redis_streams import RedisStreamConsumer
from tests.conftest import REDIS_URL

pytestmark = pytest.mark.redis


def make_laned(prefix: str, name: str = "w1") -> LanedConsumer[WireRequest]:
    return LanedConsumer([RedisStreamConsumer(REDIS_URL, lane_key(prefix, lane), "workers", name, decode_request,
                                              block_ms=200) for lane in LANES])


def test_priorities_map_to_lanes() -> None:
    assert request_key("p", -3) == "p:requests:urgent"
    assert request_key("p", 0) == "p:requests"
    assert request_key("p", 10) == "p:requests:bulk"


def test_the_client_queues_by_priority_and_a_read_takes_urgent_first(prefix: str) -> None:
    async def scenario() -> None:
        consumer = make_laned(prefix)
        await consumer.ensure_group()
        async with AqueductClient(REDIS_URL, prefix=prefix) as client:
            await client.submit_many([WireRequest(id=f"bulk{i}", prompt="x", priority=10) for i in range(4)])
            await client.submit_many([WireRequest(id=f"norm{i}", prompt="x") for i in range(2)])
            await client.submit(WireRequest(id="urgent0", prompt="x", priority=-1))
        redis = aioredis.Redis.from_url(REDIS_URL)
        assert await redis.xlen(f"{prefix}:requests:bulk") == 4
        assert await redis.xlen(f"{prefix}:requests") == 2
        assert await redis.xlen(f"{prefix}:requests:urgent") == 1
        one = await consumer.receive(max_count=1, timeout_s=0)
        assert [d.message.id for d in one] == ["urgent0"]
        two = await consumer.receive(max_count=2, timeout_s=0)
        assert [d.message.id for d in two] == ["norm0", "norm1"]
        rest = await consumer.receive(max_count=10, timeout_s=0)
        assert [d.message.id for d in rest] == ["bulk0", "bulk1", "bulk2", "bulk3"]
        for delivery in one + two + rest:
            await delivery.ack()
        for lane in LANES:
            assert (await redis.xpending(lane_key(prefix, lane), "workers"))["pending"] == 0
        await consumer.close()
        await redis.aclose()

    asyncio.run(scenario())


def test_a_wide_read_leaves_one_entry_to_each_less_urgent_lane(prefix: str) -> None:
    async def scenario() -> None:
        consumer = make_laned(prefix)
        await consumer.ensure_group()
        async with AqueductClient(REDIS_URL, prefix=prefix) as client:
            await client.submit_many([WireRequest(id=f"u{i}", prompt="x", priority=-5) for i in range(10)]
                                     + [WireRequest(id=f"n{i}", prompt="x") for i in range(3)]
                                     + [WireRequest(id=f"b{i}", prompt="x", priority=3) for i in range(3)])
        got = [d.message.id for d in await consumer.receive(max_count=8, timeout_s=0)]
        assert got == ["u0", "u1", "u2", "u3", "u4", "u5", "n0", "b0"]
        await consumer.close()

    asyncio.run(scenario())


def test_a_blocked_read_wakes_on_any_lane(prefix: str) -> None:
    async def scenario() -> None:
        consumer = make_laned(prefix)
        await consumer.ensure_group()

        async def submit_later() -> None:
            await asyncio.sleep(0.3)
            async with AqueductClient(REDIS_URL, prefix=prefix) as client:
                await client.submit(WireRequest(id="late-bulk", prompt="x", priority=7))

        task = asyncio.create_task(submit_later())
        got = await consumer.receive(max_count=4, timeout_s=5)
        await task
        assert [d.message.id for d in got] == ["late-bulk"]
        assert await consumer.receive(max_count=4, timeout_s=0.2) == []
        await consumer.close()

    asyncio.run(scenario())


def test_a_deleted_lane_is_recreated_while_blocked_reads_go_on(prefix: str) -> None:
    async def scenario() -> None:
        consumer = make_laned(prefix)
        await consumer.ensure_group()
        redis = aioredis.Redis.from_url(REDIS_URL)
        await redis.delete(lane_key(prefix, "urgent"))
        assert await consumer.receive(max_count=2, timeout_s=0.5) == []
        async with AqueductClient(REDIS_URL, prefix=prefix) as client:
            await client.submit(WireRequest(id="u", prompt="x", priority=-1))
        assert [d.message.id for d in await consumer.receive(max_count=2, timeout_s=2)] == ["u"]
        await consumer.close()
        await redis.aclose()

    asyncio.run(scenario())
