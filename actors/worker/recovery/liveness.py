"""Worker liveness: `{prefix}:worker:{name}` exists while the worker runs (refreshed, with a TTL).
Its value is the worker's --max-in-flight, which gateways sum into the fleet's capacity
(actors/http/tenancy/fair_gate.py)."""

from __future__ import annotations

import asyncio

import redis.asyncio as aioredis
import structlog
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

log = structlog.get_logger(__name__)


def heartbeat_key(prefix: str, worker: str) -> str:
    return f"{prefix}:worker:{worker}"


class Heartbeat:
    name = "heartbeat"

    def __init__(self, redis: aioredis.Redis, prefix: str, worker: str, ttl_ms: int, capacity: int = 1) -> None:
        self.redis = redis
        self.capacity = capacity
        self.key = heartbeat_key(prefix, worker)
        self.ttl_ms = ttl_ms

    async def run(self) -> None:
        while True:
            try:
                await self.redis.set(self.key, self.capacity, px=self.ttl_ms)
            except (RedisConnectionError, RedisTimeoutError, OSError) as error:
                log.warning("heartbeat failed", error=str(error))
            await asyncio.sleep(self.ttl_ms / 3000)
