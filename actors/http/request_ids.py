"""Client-chosen request ids (`X-Request-Id`) belong to the request that first used them.

A retry with the same id attaches to the running or finished request's reply stream instead of
generating again, and a client that goes away cancels its request. Without a check, anyone who
learns an id could read that request's output, or cancel it by attaching and hanging up. So the
first use binds the id to a fingerprint of who sent it and what it asked (a hash of the API key
given and of the body); a later use with another fingerprint is a 409 and never reaches the
request. Embedded, the bindings live in memory (bounded, oldest forgotten first); behind Redis,
in `{prefix}:rid:{id}`, set once with NX and kept as long as reply streams are (an hour).
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from typing import Any, Protocol

import redis.asyncio as aioredis

_KEPT_IN_MEMORY = 65_536
_REDIS_TTL_S = 3600  # as reply streams (RedisReplySink's expire_s)


def request_fingerprint(authorization: str | None, body: Any) -> str:
    """Who (the Authorization header, hashed with the rest) and what (the body, canonically)."""
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(f"{authorization or ''}\0{canonical}".encode()).hexdigest()


class RequestIdOwners(Protocol):
    async def bind(self, request_id: str, fingerprint: str) -> bool:
        """True when `request_id` is new (now bound to `fingerprint`) or already bound to it."""
        ...


class MemoryRequestIds:
    def __init__(self, capacity: int = _KEPT_IN_MEMORY) -> None:
        self.capacity = capacity
        self._owners: OrderedDict[str, str] = OrderedDict()

    async def bind(self, request_id: str, fingerprint: str) -> bool:
        owner = self._owners.setdefault(request_id, fingerprint)
        self._owners.move_to_end(request_id)
        while len(self._owners) > self.capacity:
            self._owners.popitem(last=False)
        return owner == fingerprint


class RedisRequestIds:
    def __init__(self, redis: aioredis.Redis, prefix: str, ttl_s: int = _REDIS_TTL_S) -> None:
        self.redis, self.prefix, self.ttl_s = redis, prefix, ttl_s

    async def bind(self, request_id: str, fingerprint: str) -> bool:
        key = f"{self.prefix}:rid:{request_id}"
        if await self.redis.set(key, fingerprint, nx=True, ex=self.ttl_s):
            return True
        owner = await self.redis.get(key)
        return owner is None or owner.decode() == fingerprint  # None: expired in between, as new
