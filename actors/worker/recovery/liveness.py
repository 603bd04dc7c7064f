"""Worker liveness: `{prefix}:worker:{name}` exists while the worker runs (refreshed, with a TTL)."""

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

    def __init__(self, redis: aioredis.Redis, prefix: str, worker: str, ttl_ms: int) -> None:
        self.redis = redis
        self.key = heartbeat_key(prefix, worker)
        self.ttl_ms = ttl_ms

    async def run(self) -> None:
        while True:
            try:
                await self.redis.set(self.key, 1, px=self.ttl_ms)
            except (RedisConnectionError, RedisTimeoutError, OSError) as error:
                log.warning("heartbeat failed", error=str(error))
            await asyncio.sleep(self.ttl_ms / 3000)
