"""Control actor: every worker reads `{prefix}:control` (no consumer group: a cancel must reach
whichever worker holds the request) and forwards cancels to its scheduler."""

from __future__ import annotations

import asyncio
from typing import Any

import redis.asyncio as aioredis
import structlog
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from actors.messages import Cancel
from queue_adapters.base import Producer
from queue_adapters.codec import CodecError, decode_cancel
from queue_adapters.redis_streams import DATA_FIELD, Backoff

log = structlog.get_logger(__name__).bind(actor="control")


class ControlActor:
    name = "control"

    def __init__(self, redis: aioredis.Redis, prefix: str, to_scheduler: Producer[Any], block_ms: int = 1000) -> None:
        self.redis = redis
        self.key = f"{prefix}:control"
        self.to_scheduler = to_scheduler
        self.block_ms = block_ms
        self.backoff = Backoff()

    async def run(self) -> None:
        last_id = "$"  # only cancels issued from now on
        while True:
            try:
                response = await self.redis.xread({self.key: last_id}, block=self.block_ms, count=100)
            except (RedisConnectionError, RedisTimeoutError, OSError) as error:
                log.warning("control stream unreachable; retrying", error=str(error))
                await asyncio.sleep(self.backoff.next_delay_s())
                continue
            self.backoff.reset()
            for _, entries in response or []:
                for entry_id, fields in entries:
                    last_id = entry_id
                    await self._forward(fields)

    async def _forward(self, fields: dict[bytes, bytes]) -> None:
        try:
            cancel = decode_cancel(fields.get(DATA_FIELD, b""))
        except CodecError as error:
            log.warning("ignored malformed control entry", error=str(error))
            return
        await self.to_scheduler.send(Cancel(cancel.cancel))
