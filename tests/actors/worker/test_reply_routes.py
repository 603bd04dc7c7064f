"""Who may write a reply stream: a request its own, requests sharing a stream no request owns, and no
request the deployment's own keys (actors/worker/reply_routes.py, the owner keys of ownership.py)."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis

from actors.worker.recovery.ownership import SHARED_STREAM, Claim, Ownership
from actors.worker.replies import RedisReplySink
from actors.worker.reply_routes import reply_to_allowed, shared_stream_of
from queue_adapters.codec import WireError, WireReply


@pytest.mark.parametrize("key", ["requests", "control", "control:results", "dead", "owner:r1", "worker:w0",
                                 "rid:abc", "edge:w0:scheduler"])
def test_the_deployments_own_keys_are_never_reply_streams_whatever_the_pattern(key: str) -> None:
    assert not reply_to_allowed(f"p:{key}", "p", pattern="p:*")
    assert not reply_to_allowed(f"p:{key}", "p")


def test_allowed_reply_streams() -> None:
    assert reply_to_allowed("p:out:anything", "p")
    assert not reply_to_allowed("q:out:x", "p")
    assert reply_to_allowed("app:replies:1", "p", pattern="app:replies:*")
    assert not reply_to_allowed("p:out:x", "p", pattern="app:replies:*")


def test_a_reply_to_shares_the_stream_of_the_id_it_is_named_after() -> None:
    assert shared_stream_of("p:out:r1", "p", "r1") == ""  # its own
    assert shared_stream_of("p:out:r2", "p", "r1") == "r2"
    assert shared_stream_of("p:out:a:b", "p", "r1") == "a:b"  # ids may hold colons
    assert shared_stream_of("p:out:not an id", "p", "r1") == ""  # no request can own it
    assert shared_stream_of("app:replies:r2", "p", "r1") == ""


def test_a_stream_is_its_requests_or_its_sharers_never_both(redis_url, prefix):
    async def scenario() -> None:
        redis = aioredis.from_url(redis_url)
        ownership = Ownership(redis, prefix, "me", ttl_s=600)
        try:
            claims = await ownership.claim(["owner", "sharer-1", "sharer-2", "intruder"], ["a", "b", "c", "d"],
                                           ["", "group", "group", "owner"])
            assert claims == [Claim.FRESH, Claim.FRESH, Claim.FRESH, Claim.STREAM_TAKEN]
            assert await redis.get(ownership.key("group")) == SHARED_STREAM.encode()
            assert await ownership.claim(["group"], ["e"]) == [Claim.CONFLICT]  # the stream is shared
            assert await redis.get(ownership.key("group")) == SHARED_STREAM.encode()
            assert ownership.stream_key(f"{prefix}:out:group") == ownership.key("group")
            assert ownership.stream_key("elsewhere:x") is None
        finally:
            await redis.aclose()

    asyncio.run(scenario())


def test_a_final_entry_on_a_shared_stream_keeps_its_record_as_long_as_the_stream(redis_url, prefix):
    async def scenario() -> None:
        redis = aioredis.from_url(redis_url)
        ownership = Ownership(redis, prefix, "me", ttl_s=5)
        sink = RedisReplySink(redis, expire_s=600, owner_key=ownership.key, stream_owner_key=ownership.stream_key)
        try:
            await ownership.claim(["sharer"], ["a"], ["group"])
            final = WireReply(id="sharer", seq=0, error=WireError(code="abort", message=""))
            assert await sink.write([(f"{prefix}:out:group", final)]) == []
            for key in (ownership.key("group"), ownership.key("sharer"), f"{prefix}:out:group"):
                assert 5 < await redis.ttl(key) <= 600, key
        finally:
            await sink.close()
            await redis.aclose()

    asyncio.run(scenario())
