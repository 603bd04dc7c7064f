"""The streams between a worker's actors: memory by default, Redis Streams where configured.

Only inboxes whose messages are plain data can move onto Redis (docs/design.md §2): the scheduler's
(Admit, StepResult, StopStringFinish, Cancel; a pooling worker's Embed), tensor prep's (StepPlan) and
output's step events (a pooling worker's Embedded).
GPU and sampling inboxes carry arrays/tensors, and output's routes carry ack handles: memory only.
"""

from __future__ import annotations

from typing import Any

import redis.asyncio as aioredis

from actors.kit.message_codec import decode_message, encode_message
from queue_adapters.base import Consumer, Producer
from queue_adapters.memory import MemoryStream
from queue_adapters.redis_streams import RedisStreamConsumer, RedisStreamProducer

REDIS_CAPABLE = ("scheduler", "tensor_prep", "output_events")
MEMORY_ONLY = ("gpu", "sampling", "output_routes")


class Edges:
    def __init__(self, redis_edges: frozenset[str] = frozenset(), redis_url: str | None = None,
                 redis: aioredis.Redis | None = None, prefix: str = "aqueduct", worker: str = "worker") -> None:
        unknown = sorted(redis_edges - set(REDIS_CAPABLE))
        if unknown:
            raise ValueError(f"these edges cannot run over Redis: {', '.join(unknown)} "
                             f"(plain-data edges: {', '.join(REDIS_CAPABLE)})")
        if redis_edges and (redis_url is None or redis is None):
            raise ValueError("Redis edges need a Redis URL")
        self.redis_edges = redis_edges
        self.redis_url = redis_url
        self.redis = redis
        self.prefix = prefix
        self.worker = worker
        self._consumers: list[RedisStreamConsumer] = []

    def make(self, name: str) -> tuple[Producer[Any], Consumer[Any]]:
        if name not in self.redis_edges:
            stream = MemoryStream[Any](name=name)
            return stream.producer(), stream.consumer()
        key = f"{self.prefix}:edge:{self.worker}:{name}"
        consumer = RedisStreamConsumer(self.redis_url, key, "edge", self.worker, decode_message, client=self.redis,
                                       block_ms=50, group_start_id="$")
        self._consumers.append(consumer)
        return RedisStreamProducer(self.redis, key, encode_message), consumer

    async def start(self) -> None:
        for consumer in self._consumers:
            await consumer.ensure_group()

    async def close(self) -> None:
        for consumer in self._consumers:
            await consumer.close()
        if self.redis is not None and self._consumers:
            await self.redis.delete(*(consumer.stream_key for consumer in self._consumers))
