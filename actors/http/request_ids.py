"""Client-chosen request ids (`X-Request-Id`) belong to the request that first used them.

A retry with the same id attaches to the running or finished request's reply stream instead of
generating again, and a client that goes away cancels its request. Without a check, anyone who
learns an id could read that request's output, or cancel it by attaching and hanging up. So the
first use binds the id to a fingerprint of who sent it and what it asked (a hash of the API key
given and of the body); a later use with another fingerprint is a 409 and never reaches the
request. Every id a request derives (`{id}:{index}` for a list of prompts) is bound with it, so no
other client can name one of its prompts. A binding lasts as long as the request's replay window,
an hour from its first use, as reply streams are kept: embedded, in memory (forgotten when that
hour has passed, however many ids came since); behind Redis, in `{prefix}:rid:{id}`, set once with
NX and an expiry.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Protocol

import redis.asyncio as aioredis

REPLAY_WINDOW_S = 3600  # as reply streams are kept (RedisReplySink's expire_s)


def request_fingerprint(authorization: str | None, body: Any) -> str:
    """Who (the Authorization header, hashed with the rest) and what (the body, canonically)."""
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(f"{authorization or ''}\0{canonical}".encode()).hexdigest()


class RequestIdOwners(Protocol):
    async def bind(self, request_id: str, fingerprint: str) -> bool:
        """True when `request_id` is new (now bound to `fingerprint`) or already bound to it."""
        ...


class MemoryRequestIds:
    def __init__(self, ttl_s: float = REPLAY_WINDOW_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s, self.clock = ttl_s, clock
        self._owners: OrderedDict[str, tuple[str, float]] = OrderedDict()  # id -> (fingerprint, bound at), oldest first

    async def bind(self, request_id: str, fingerprint: str) -> bool:
        now = self.clock()
        while self._owners and next(iter(self._owners.values()))[1] <= now - self.ttl_s:
            self._owners.popitem(last=False)
        owner, _ = self._owners.setdefault(request_id, (fingerprint, now))
        return owner == fingerprint


class RedisRequestIds:
    def __init__(self, redis: aioredis.Redis, prefix: str, ttl_s: int = REPLAY_WINDOW_S) -> None:
        self.redis, self.prefix, self.ttl_s = redis, prefix, ttl_s

    async def bind(self, request_id: str, fingerprint: str) -> bool:
        key = f"{self.prefix}:rid:{request_id}"
        if await self.redis.set(key, fingerprint, nx=True, ex=self.ttl_s):
            return True
        owner = await self.redis.get(key)
        return owner is None or owner.decode() == fingerprint  # None: expired in between, as new
