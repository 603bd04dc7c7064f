"""Ownership.claim on a real Redis: fresh ids, ids held by this worker or a dead one, ids held by a
live worker; and Intake reads a reply stream only for an id held before."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis

from actors.worker.recovery.liveness import heartbeat_key
from actors.worker.recovery.ownership import Claim, Ownership, fingerprint_of
from queue_adapters.codec import WireRequest

pytestmark = pytest.mark.redis


def test_claims_in_one_call(redis_url, prefix):
    async def scenario() -> None:
        redis = aioredis.from_url(redis_url)
        ownership = Ownership(redis, prefix, "me", ttl_s=600)
        try:
            await redis.set(ownership.key("mine"), "me")
            await redis.set(ownership.key("dead"), "gone")
            await redis.set(ownership.key("live"), "other")
            await redis.set(heartbeat_key(prefix, "other"), 1, ex=60)
            claims = await ownership.claim(["new", "mine", "dead", "live"])
            assert claims == [Claim.FRESH, Claim.TAKEN, Claim.TAKEN, Claim.ELSEWHERE]
            for request_id in ("new", "mine", "dead"):
                assert await redis.get(ownership.key(request_id)) == b"\nme"  # no fingerprint given
                assert 0 < await redis.ttl(ownership.key(request_id)) <= 600
            assert await redis.get(ownership.key("live")) == b"other"
            assert await ownership.claim(["new"]) == [Claim.TAKEN]  # held now
            assert await ownership.claim([]) == []
        finally:
            await redis.aclose()

    asyncio.run(scenario())


def test_an_id_held_by_a_different_request_is_a_conflict(redis_url, prefix):
    async def scenario() -> None:
        redis = aioredis.from_url(redis_url)
        ownership = Ownership(redis, prefix, "me", ttl_s=600)
        first = WireRequest(id="x", prompt="a", params={"max_tokens": 3}, deadline_ms=1)
        retry = WireRequest(id="x", prompt="a", params={"max_tokens": 3}, deadline_ms=2)  # a retry's new deadline
        other = WireRequest(id="x", prompt="b", params={"max_tokens": 3})
        try:
            assert fingerprint_of(first) == fingerprint_of(retry) != fingerprint_of(other)
            assert await ownership.claim(["x"], [fingerprint_of(first)]) == [Claim.FRESH]
            assert await ownership.claim(["x"], [fingerprint_of(retry)]) == [Claim.TAKEN]
            assert await ownership.claim(["x"], [fingerprint_of(other)]) == [Claim.CONFLICT]
            assert await ownership.claim(["x"]) == [Claim.TAKEN]  # no fingerprint: as before
            await redis.set(ownership.key("old"), "other")  # written by a worker before fingerprints
            assert await ownership.claim(["old"], [fingerprint_of(other)]) == [Claim.TAKEN]
        finally:
            await redis.aclose()

    asyncio.run(scenario())
