"""Idempotency across workers: one owner per request id.

`{prefix}:owner:{id}` names the worker generating a request (SET NX). A second entry with the same
id, on any worker, finds a live owner and is acked without generating again; the client reads the
one reply stream. An owner whose heartbeat is gone is replaced, and the new owner resumes.
"""

from __future__ import annotations

import redis.asyncio as aioredis

from actors.recovery.liveness import heartbeat_key


class Ownership:
    def __init__(self, redis: aioredis.Redis, prefix: str, worker: str, ttl_s: int) -> None:
        self.redis = redis
        self.prefix = prefix
        self.worker = worker
        self.ttl_s = ttl_s

    def _key(self, request_id: str) -> str:
        return f"{self.prefix}:owner:{request_id}"

    async def acquire(self, request_id: str) -> bool:
        """True when this worker may generate the request (it owns it now)."""
        key = self._key(request_id)
        if await self.redis.set(key, self.worker, nx=True, ex=self.ttl_s):
            return True
        owner = await self.redis.get(key)
        if owner is not None and owner.decode() != self.worker \
                and await self.redis.exists(heartbeat_key(self.prefix, owner.decode())):
            return False  # alive elsewhere: that worker answers it
        await self.redis.set(key, self.worker, ex=self.ttl_s)  # ours already, or its owner is gone
        return True
