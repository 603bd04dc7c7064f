"""RedisReplySink on a real Redis: a step's entries in order, per stream; final streams expire."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis

from actors.worker.replies import RedisReplySink
from queue_adapters.codec import WireChoice, WireReply, WireUsage, decode_reply
from queue_adapters.redis_streams import DATA_FIELD

pytestmark = pytest.mark.redis


def _reply(request_id: str, seq: int, final: bool) -> WireReply:
    return WireReply(id=request_id, seq=seq, choices=[WireChoice(index=0, token_ids=[seq + 3], text=f"t{seq}")],
                     usage=WireUsage(prompt_tokens=2, completion_tokens=seq + 1) if final else None)


def test_entries_land_in_order_and_final_streams_expire(redis_url, prefix):
    async def scenario() -> None:
        redis = aioredis.from_url(redis_url)
        sink = RedisReplySink(redis, expire_s=600)
        shared, running, done = f"{prefix}:out:shared", f"{prefix}:out:a", f"{prefix}:out:b"
        try:
            await sink.write([(running, _reply("a", 0, False)), (done, _reply("b", 0, False)),
                              (shared, _reply("c", 0, False)), (shared, _reply("d", 0, False))])
            await redis.script_flush()  # as after a Redis restart: the script is loaded again
            await sink.write([(done, _reply("b", 1, True)), (shared, _reply("c", 1, False))])
            read = {key: [decode_reply(fields[DATA_FIELD]) for _, fields in await redis.xrange(key)]
                    for key in (running, done, shared)}
            assert [(r.id, r.seq) for r in read[shared]] == [("c", 0), ("d", 0), ("c", 1)]
            assert [(r.seq, r.usage is not None) for r in read[done]] == [(0, False), (1, True)]
            assert read[running][0].choices[0].text == "t0"
            assert 0 < await redis.ttl(done) <= 600
            assert await redis.ttl(running) == -1 and await redis.ttl(shared) == -1  # not final: no expiry
        finally:
            await sink.close()
            await redis.aclose()

    asyncio.run(scenario())


def test_a_final_entry_gives_the_owner_key_the_streams_expiry(redis_url, prefix):
    """So the owner record outlives the reply stream (actors/worker/recovery/ownership.py)."""
    async def scenario() -> None:
        redis = aioredis.from_url(redis_url)
        sink = RedisReplySink(redis, expire_s=600, owner_key=lambda request_id: f"{prefix}:owner:{request_id}")
        try:
            for request_id in ("a", "b", "c"):
                await redis.set(f"{prefix}:owner:{request_id}", "w", ex=5)
            await sink.write([(f"{prefix}:out:a", _reply("a", 0, False)), (f"{prefix}:out:b", _reply("b", 0, True)),
                              (f"{prefix}:out:shared", _reply("c", 3, True))])
            assert 5 < await redis.ttl(f"{prefix}:owner:b") <= 600
            assert 5 < await redis.ttl(f"{prefix}:owner:c") <= 600
            assert await redis.ttl(f"{prefix}:owner:a") <= 5  # not final: untouched
            assert 5 < await redis.ttl(f"{prefix}:out:shared") <= 600
        finally:
            await sink.close()
            await redis.aclose()

    asyncio.run(scenario())
