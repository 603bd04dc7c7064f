"""Ownership.claim on a real Redis: fresh ids, ids held by this worker or a dead one, ids held by a
live worker; and Intake reads a reply stream only for an id held before."""

from __future__ import annotations

import asyncio

import redis.asyncio as aioredis

from actors.recovery.liveness import heartbeat_key
from actors.recovery.ownership import Claim, Ownership


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
                assert await redis.get(ownership.key(request_id)) == b"me"
                assert 0 < await redis.ttl(ownership.key(request_id)) <= 600
            assert await redis.get(ownership.key("live")) == b"other"
            assert await ownership.claim(["new"]) == [Claim.TAKEN]  # held now
            assert await ownership.claim([]) == []
        finally:
            await redis.aclose()

    asyncio.run(scenario())
