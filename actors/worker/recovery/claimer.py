"""Crash resume: a worker takes over the pending requests of dead ones (see actors/worker/recovery/liveness.py).

Every so often, list request entries unacked for at least claim_idle_ms; those whose consumer has no
heartbeat are claimed (XCLAIM) and go through Intake, which resumes them from what their reply
streams already hold. A live but slow worker keeps its entries however long they take.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import redis.asyncio as aioredis
import structlog
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from actors.worker.admission import Admission
from actors.worker.recovery.liveness import heartbeat_key
from queue_adapters.base import Delivery
from queue_adapters.codec import Malformed, WireRequest
from queue_adapters.redis_streams import RedisStreamConsumer

log = structlog.get_logger(__name__)


class Claimer:
    name = "claimer"

    def __init__(self, redis: aioredis.Redis, consumer: RedisStreamConsumer[WireRequest | Malformed],
                 admit: Callable[[Delivery[WireRequest | Malformed]], Awaitable[None]], admission: Admission,
                 prefix: str, claim_idle_ms: int) -> None:
        self.redis = redis
        self.consumer = consumer
        self.admit = admit  # the intake actor's: a claimed entry is admitted as a read one is
        self.admission = admission
        self.prefix = prefix
        self.claim_idle_ms = claim_idle_ms

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.claim_idle_ms / 2000)
            try:
                await self.claim_orphans()
            except (RedisConnectionError, RedisTimeoutError, OSError) as error:
                log.warning("claim pass failed", error=str(error))

    async def claim_orphans(self, stream: RedisStreamConsumer[WireRequest | Malformed] | None = None) -> int:
        """Claim on `stream` (default: this claimer's own) the entries of consumers that are gone."""
        stream = stream or self.consumer
        room = self.admission.max_in_flight - self.admission.in_flight
        if room <= 0:
            return 0
        stale = await stream.pending(self.claim_idle_ms, count=max(room * 4, 16))
        others = {consumer for _, consumer in stale if consumer != stream.consumer_name}
        alive = {c for c in others if await self.redis.exists(heartbeat_key(self.prefix, c))}
        orphans = [entry_id for entry_id, consumer in stale if consumer in others - alive][:room]
        deliveries = await stream.claim(orphans, self.claim_idle_ms)
        for delivery in deliveries:
            log.info("claimed an orphaned request", entry_id=delivery.message_id, attempt=delivery.attempt)
            await self.admit(delivery)
        return len(deliveries)
