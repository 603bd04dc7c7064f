"""The worker's part in prefix placement (queue_adapters/placement.py): it tells the fleet which
prefix blocks it caches and how much room it has, and looks after other workers' affinity streams
(orphaned offers are claimed, the streams of workers that are gone are retired).

The directory is published as diffs (the block pool's journal) every `interval_s` while anything
changed, refreshed at a third of the TTL otherwise; a failed write republishes the whole set next
time, so the published set converges on the cache whatever Redis did in between.
"""

from __future__ import annotations

import asyncio
from typing import Any

import redis.asyncio as aioredis
import structlog
from redis.exceptions import RedisError

from actors.worker.admission import Admission
from actors.worker.recovery.claimer import Claimer
from actors.worker.recovery.liveness import heartbeat_key
from pipeline.scheduling.block_pool import BlockPool
from queue_adapters.placement import affinity_keys, blocks_key, room_key, workers_key
from queue_adapters.stealing import AffinityStreams, retire_if_gone

log = structlog.get_logger(__name__)

_CHUNK = 4096  # members per SADD/SREM command


class PrefixPublisher:
    name = "prefix_publisher"

    def __init__(self, redis: aioredis.Redis, prefix: str, worker: str, pool: BlockPool, admission: Admission,
                 ttl_ms: int, interval_s: float = 0.05) -> None:
        assert pool.journal is not None, "the block pool must record placement keys (publish_prefix_keys)"
        self.redis, self.prefix, self.worker = redis, prefix, worker
        self.pool, self.journal, self.admission = pool, pool.journal, admission
        self.ttl_ms, self.interval_s = ttl_ms, interval_s
        self._resync = True  # the first publish replaces whatever an earlier worker of this name left
        self._published_room: int | None = None
        self._refreshed_at = float("-inf")

    async def run(self) -> None:
        while True:
            try:
                await self.publish()
            except (RedisError, OSError) as error:
                self._resync = True
                log.warning("prefix directory not published", error=str(error))
            await asyncio.sleep(self.interval_s)

    async def publish(self) -> None:
        cleared, added, removed = self.journal.drain()
        room = max(0, self.admission.max_in_flight - self.admission.in_flight)
        now = asyncio.get_running_loop().time()
        refresh_due = now - self._refreshed_at > self.ttl_ms / 3000
        if not (cleared or added or removed or self._resync or refresh_due or room != self._published_room):
            return
        resync, self._resync = self._resync or cleared, True  # stays set if this write fails
        blocks = blocks_key(self.prefix, self.worker)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.exists(blocks)
            if resync:
                pipe.delete(blocks)
                added, removed = set(self.pool.published_prefix_keys()), set()
            for members, command in ((list(added), pipe.sadd), (list(removed), pipe.srem)):
                for start in range(0, len(members), _CHUNK):
                    command(blocks, *members[start:start + _CHUNK])
            pipe.pexpire(blocks, self.ttl_ms)
            pipe.set(room_key(self.prefix, self.worker), room, px=self.ttl_ms)
            pipe.sadd(workers_key(self.prefix), self.worker)
            results = await pipe.execute()
        # The set expired or was retired while this worker still caches blocks (its heartbeat lapsed
        # on a stalled machine): publish it whole next time.
        lost = not resync and not results[0] and bool(self.pool.published_prefix_keys())
        self._resync, self._published_room, self._refreshed_at = lost, room, now

    async def withdraw(self) -> None:
        """Leaving: no entry point offers to this worker any more (its waiting offers get taken)."""
        await self.redis.delete(blocks_key(self.prefix, self.worker), room_key(self.prefix, self.worker))
        await self.redis.srem(workers_key(self.prefix), self.worker)


class AffinityClaimer:
    """Crash resume on the affinity streams: what a dead worker took from any of them is claimed as
    on the shared lanes (actors/worker/recovery/claimer.py); a gone worker's streams are retired once
    nothing on them waits (queue_adapters/stealing.py)."""

    name = "affinity_claimer"

    def __init__(self, streams: AffinityStreams[Any], claimer: Claimer, claim_idle_ms: int) -> None:
        self.streams = streams
        self.claimer = claimer  # claims on each affinity stream in turn
        self.claim_idle_ms = claim_idle_ms

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.claim_idle_ms / 2000)
            try:
                await self.claim_and_retire()
            except (RedisError, OSError) as error:
                log.warning("affinity claim pass failed", error=str(error))

    async def claim_and_retire(self) -> int:
        claimed = 0
        for worker in [self.streams.consumer_name, *await self.streams.other_workers(cached=False)]:
            for stream_key in affinity_keys(self.streams.prefix, worker):
                if await self.streams.redis.exists(stream_key):  # a retired worker's are gone
                    claimed += await self.claimer.claim_orphans(self.streams.consumer(stream_key))
            if worker != self.streams.consumer_name:
                heartbeat = heartbeat_key(self.streams.prefix, worker)
                if await retire_if_gone(self.streams, worker, heartbeat):
                    log.info("retired a gone worker's affinity streams", gone=worker)
        return claimed
