"""Prefix placement on a real Redis (queue_adapters/placement.py, stealing.py): an entry point offers
a request to the live worker caching the longest prefix of it, that worker reads its offers first,
another worker takes an offer only once it waited past the placement wait, and a gone worker's
streams are retired only when nothing on them waits."""

from __future__ import annotations

import asyncio
import random

import pytest
import redis.asyncio as aioredis

from pipeline.scheduling.prefix_keys import prefix_keys
from queue_adapters.client import AqueductClient
from queue_adapters.codec import WireRequest, decode_request
from queue_adapters.placement import (
    Candidate,
    Placement,
    PrefixDirectory,
    affinity_key,
    best_candidate,
    blocks_key,
    room_key,
    workers_key,
)
from queue_adapters.priority_lanes import LANES, OFFERED, SHARED, STOLEN, LanedConsumer, LanePlacement, lane_key
from queue_adapters.redis_streams import RedisStreamConsumer
from queue_adapters.stealing import AffinityStreams, Stealer, retire_if_gone
from tests.conftest import REDIS_URL

pytestmark = pytest.mark.redis

BLOCK = 4
PROMPT = list(range(3, 15))  # three blocks


def test_the_longest_cached_prefix_wins_unless_its_holder_is_much_busier() -> None:
    def pick(*candidates: Candidate) -> tuple[str, str]:
        candidate, why = best_candidate(list(candidates), random.Random(0))
        return candidate.worker, why

    assert pick(Candidate("a", 2, 1, 8), Candidate("b", 3, 0, 8), Candidate("c", 1, 5, 8)) == ("a", "hit")
    assert pick(Candidate("a", 2, 0, 8), Candidate("b", 3, 0, 8)) == ("b", "hit")  # none has room
    assert pick(Candidate("a", 0, 4, 8), Candidate("b", 0, 6, 8)) == ("b", "miss")  # no prefix: the least busy
    assert pick(Candidate("a", 3, 56, 64), Candidate("b", 0, 64, 64)) == ("a", "hit")  # 8 busier: within 16
    assert pick(Candidate("a", 3, 40, 64), Candidate("b", 0, 64, 64)) == ("b", "balanced")  # 24 busier
    spread = {best_candidate([Candidate("a", 0, 8, 8), Candidate("b", 0, 8, 8)])[0].worker for _ in range(64)}
    assert spread == {"a", "b"}  # equally idle: either, so entry points deciding at once spread out


async def _publish(redis: aioredis.Redis, prefix: str, worker: str, keys: list[bytes], room: int = 4) -> None:
    await redis.set(f"{prefix}:worker:{worker}", 8, px=30_000)
    await redis.sadd(workers_key(prefix), worker)
    if keys:
        await redis.sadd(blocks_key(prefix, worker), *keys)
    await redis.set(room_key(prefix, worker), room)


def _laned(prefix: str, name: str, wait_ms: int, redis: aioredis.Redis) -> LanedConsumer[WireRequest]:
    streams = AffinityStreams(REDIS_URL, redis, prefix, "workers", name, decode_request)
    lanes = [RedisStreamConsumer(REDIS_URL, lane_key(prefix, lane), "workers", name, decode_request, block_ms=200)
             for lane in LANES]
    placement = LanePlacement([streams.consumer(affinity_key(prefix, lane, name)) for lane in LANES],
                              [Stealer(streams, lane, wait_ms) for lane in LANES], streams.other_workers, wait_ms)
    return LanedConsumer(lanes, placement)


def test_a_request_is_offered_to_the_worker_holding_its_prefix_and_read_there_first(prefix: str) -> None:
    async def scenario() -> None:
        redis = aioredis.Redis.from_url(REDIS_URL)
        holder, other = _laned(prefix, "holder", 60_000, redis), _laned(prefix, "other", 60_000, redis)
        for consumer in (holder, other):
            await consumer.ensure_group()
        await _publish(redis, prefix, "holder", prefix_keys(PROMPT[:8], BLOCK))  # two of the three blocks
        await _publish(redis, prefix, "other", prefix_keys(PROMPT[:4], BLOCK), room=6)
        placement = Placement(PrefixDirectory(redis, prefix), BLOCK)
        async with AqueductClient(REDIS_URL, prefix=prefix, redis=redis, placement=placement) as client:
            await client.submit(WireRequest(id="missed", prompt_token_ids=[1, 2, 3, 4]))  # cached nowhere
            await client.submit(WireRequest(id="placed", prompt_token_ids=PROMPT))
            await client.submit(WireRequest(id="short", prompt_token_ids=[1, 2]))  # no full block: not placed
        assert placement.outcomes == {"miss": 1, "hit": 1, "unplaced": 1}
        assert [d.message.id for d in await other.receive(4, timeout_s=0.3)] == ["missed", "short"]  # the least busy
        assert [d.message.id for d in await holder.receive(4, timeout_s=0.3)] == ["placed"]
        assert (holder.taken[OFFERED], other.taken[OFFERED], other.taken[SHARED]) == (1, 1, 1)
        for consumer in (holder, other):
            await consumer.close()
        await redis.aclose()

    asyncio.run(scenario())


def test_an_offer_left_unread_is_taken_after_the_wait_and_not_before(prefix: str) -> None:
    async def scenario() -> None:
        redis = aioredis.Redis.from_url(REDIS_URL)
        holder, thief = _laned(prefix, "holder", 300, redis), _laned(prefix, "thief", 300, redis)
        for consumer in (holder, thief):
            await consumer.ensure_group()
        await _publish(redis, prefix, "holder", prefix_keys(PROMPT, BLOCK))
        await _publish(redis, prefix, "thief", [])
        placement = Placement(PrefixDirectory(redis, prefix), BLOCK)
        async with AqueductClient(REDIS_URL, prefix=prefix, redis=redis, placement=placement) as client:
            await client.submit(WireRequest(id="r", prompt_token_ids=PROMPT, priority=5))
        assert await thief.receive(4, timeout_s=0) == []  # fresh: still the holder's
        taken = await thief.receive(4, timeout_s=2.0)  # the holder is busy: never reads
        assert [d.message.id for d in taken] == ["r"] and thief.taken[STOLEN] == 1
        await taken[0].ack()
        stream = affinity_key(prefix, "bulk", "holder")
        assert (await redis.xpending(stream, "workers"))["pending"] == 0
        assert await holder.receive(4, timeout_s=0) == []  # taken once
        for consumer in (holder, thief):
            await consumer.close()
        await redis.aclose()

    asyncio.run(scenario())


def test_an_offer_to_a_worker_without_a_heartbeat_goes_to_the_shared_lane(prefix: str) -> None:
    async def scenario() -> None:
        redis = aioredis.Redis.from_url(REDIS_URL)
        directory = PrefixDirectory(redis, prefix)
        stream, _ = await directory.offer(b"\x80", 0, "gone")
        assert stream == lane_key(prefix, "normal")
        await redis.aclose()

    asyncio.run(scenario())


def test_a_gone_workers_streams_are_retired_only_when_nothing_on_them_waits(prefix: str) -> None:
    async def scenario() -> None:
        redis = aioredis.Redis.from_url(REDIS_URL)
        gone = _laned(prefix, "gone", 0, redis)
        await gone.ensure_group()
        await _publish(redis, prefix, "gone", prefix_keys(PROMPT, BLOCK))
        await PrefixDirectory(redis, prefix).offer(b"x", 0, "gone")
        streams = AffinityStreams(REDIS_URL, redis, prefix, "workers", "alive", decode_request)
        heartbeat = f"{prefix}:worker:gone"
        assert not await retire_if_gone(streams, "gone", heartbeat)  # its heartbeat is there
        await redis.delete(heartbeat)
        assert not await retire_if_gone(streams, "gone", heartbeat)  # an offer waits unread
        await redis.xgroup_setid(affinity_key(prefix, "normal", "gone"), "workers", "$")  # as if read and acked
        assert await retire_if_gone(streams, "gone", heartbeat)
        assert not await redis.exists(affinity_key(prefix, "normal", "gone"), blocks_key(prefix, "gone"))
        assert await redis.smembers(workers_key(prefix)) == set()
        await gone.close()
        await redis.aclose()

    asyncio.run(scenario())
