"""A worker's request streams trimmed of acknowledged entries every TRIM_INTERVAL_S
(queue_adapters/stream_trim.py): the shared lanes and the worker's own affinity streams. Every worker
trims the shared lanes; two trims at once are harmless, as each removes only what no consumer group
can need again (read by every group, pending in none)."""

from __future__ import annotations

import asyncio

import redis.asyncio as aioredis
import structlog
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from queue_adapters.stream_trim import trim_acknowledged

log = structlog.get_logger(__name__)

TRIM_INTERVAL_S = 30.0


class StreamTrimmer:
    name = "stream-trimmer"

    def __init__(self, redis: aioredis.Redis, stream_keys: list[str], interval_s: float | None = None) -> None:
        self.redis = redis
        self.stream_keys = stream_keys
        self.interval_s = TRIM_INTERVAL_S if interval_s is None else interval_s

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            await self.trim_once()

    async def trim_once(self) -> int:
        trimmed = 0
        for key in self.stream_keys:
            try:
                trimmed += await trim_acknowledged(self.redis, key)
            except (RedisConnectionError, RedisTimeoutError, OSError, ResponseError) as error:
                log.warning("stream trim failed", stream=key, error=str(error))
        if trimmed:
            log.debug("request streams trimmed", entries=trimmed)
        return trimmed
