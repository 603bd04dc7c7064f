"""Prefix-affinity placement, the worker side: taking offers that their worker left waiting, and
retiring the affinity streams of workers that are gone (the entry side: queue_adapters/placement.py).

An offer is an entry on `{lane}:at:{worker}`, read by the same consumer group as the shared lanes.
Its worker reads it like any stream. Any other worker may take it once it has waited `wait_ms`
unread: the steal script reads, atomically, only entries older than that (a stream entry id starts
with the Redis server's clock in ms, and the script compares it with TIME on the same server), so a
steal never races the worker the offer was meant for into taking a fresh one. Taken entries are
pending under the taker, exactly as read ones: acks, crash claims and resumes are unchanged.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import redis.asyncio as aioredis

from queue_adapters.base import Delivery
from queue_adapters.codec import Malformed
from queue_adapters.placement import WORKER_LIST_TTL_S, affinity_key, blocks_key, room_key, workers_key
from queue_adapters.priority_lanes import LANES
from queue_adapters.redis_streams import RedisStreamConsumer

T = TypeVar("T")

# KEYS: other workers' affinity streams of one lane; ARGV: group, consumer, most entries, wait ms.
# For each stream: the group's last delivered id, then the undelivered entries after it that are at
# least `wait` old (ids are ms timestamps), then XREADGROUP for exactly that many.
_STEAL = """
local now = redis.call('TIME')
local cutoff = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000) - tonumber(ARGV[4])
local left = tonumber(ARGV[3])
local taken = {}
for _, key in ipairs(KEYS) do
  if left <= 0 then break end
  local last = nil
  if redis.call('EXISTS', key) == 1 then
    for _, group in ipairs(redis.call('XINFO', 'GROUPS', key)) do
      local fields = {}
      for i = 1, #group, 2 do fields[group[i]] = group[i + 1] end
      if fields['name'] == ARGV[1] then last = fields['last-delivered-id'] end
    end
  end
  if last then
    local stale = 0
    for _, entry in ipairs(redis.call('XRANGE', key, '(' .. last, '+', 'COUNT', left)) do
      if tonumber(string.match(entry[1], '^(%d+)')) > cutoff then break end
      stale = stale + 1
    end
    if stale > 0 then
      local read = redis.call('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', stale, 'STREAMS', key, '>')
      taken[#taken + 1] = read[1]
      left = left - stale
    end
  end
end
return taken
"""

# KEYS: heartbeat, directory set, room key, workers set, then the worker's affinity streams;
# ARGV: group, worker name. Retires a gone worker's keys once no offer on its streams is unread or
# unacked; 1 when retired. Atomic with the offer script's heartbeat check, so no offer is stranded.
_RETIRE = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
for i = 5, #KEYS do
  if redis.call('EXISTS', KEYS[i]) == 1 then
    for _, group in ipairs(redis.call('XINFO', 'GROUPS', KEYS[i])) do
      local fields = {}
      for j = 1, #group, 2 do fields[group[j]] = group[j + 1] end
      if fields['name'] == ARGV[1] then
        if fields['pending'] > 0 then return 0 end
        if #redis.call('XRANGE', KEYS[i], '(' .. fields['last-delivered-id'], '+', 'COUNT', 1) > 0 then return 0 end
      end
    end
  end
end
for i = 5, #KEYS do redis.call('DEL', KEYS[i]) end
redis.call('DEL', KEYS[2], KEYS[3])
redis.call('SREM', KEYS[4], ARGV[2])
return 1
"""


class AffinityStreams(Generic[T]):
    """Consumers (of this worker's group membership) for any worker's affinity streams, made on
    first use: what steals and crash claims on those streams go through."""

    def __init__(self, redis_url: str, redis: aioredis.Redis, prefix: str, group: str, consumer_name: str,
                 decode: Callable[[bytes], T]) -> None:
        self.redis_url, self.redis, self.prefix = redis_url, redis, prefix
        self.group, self.consumer_name, self.decode = group, consumer_name, decode
        self._consumers: dict[str, RedisStreamConsumer[T]] = {}
        self._others: list[str] = []
        self._others_read_at = float("-inf")

    def consumer(self, stream_key: str) -> RedisStreamConsumer[T]:
        consumer = self._consumers.get(stream_key)
        if consumer is None:
            # The reader connection is made lazily by redis-py and never used for these: no socket each.
            consumer = RedisStreamConsumer(self.redis_url, stream_key, self.group, self.consumer_name, self.decode,
                                           client=self.redis)
            self._consumers[stream_key] = consumer
        return consumer

    async def other_workers(self, cached: bool = True) -> list[str]:
        """The other workers that take offers (read at most once a second when `cached`)."""
        now = time.monotonic()
        if not cached or now - self._others_read_at > WORKER_LIST_TTL_S:
            names = await self.redis.smembers(workers_key(self.prefix))
            self._others = sorted(name for name in map(_text, names) if name != self.consumer_name)
            self._others_read_at = now
        return self._others

    def forget(self, worker: str) -> None:
        for key in [key for key in self._consumers if key.endswith(f":at:{worker}")]:
            self._consumers.pop(key)

    async def close(self) -> None:
        for consumer in self._consumers.values():
            await consumer.close()
        self._consumers.clear()


class Stealer(Generic[T]):
    """Takes other workers' offers of one lane once they have waited `wait_ms` unread."""

    def __init__(self, streams: AffinityStreams[T], lane: str, wait_ms: int) -> None:
        self.streams = streams
        self.lane = lane
        self.wait_ms = wait_ms
        self._steal = streams.redis.register_script(_STEAL)

    async def steal(self, max_count: int, workers: list[str]) -> list[Delivery[T | Malformed]]:
        if max_count < 1 or not workers:
            return []
        keys = [affinity_key(self.streams.prefix, self.lane, worker) for worker in workers]
        response = await self._steal(keys=keys, args=[self.streams.group, self.streams.consumer_name, max_count,
                                                       self.wait_ms])
        deliveries = []
        for stream_key, entries in response or []:
            consumer = self.streams.consumer(_text(stream_key))
            deliveries += [consumer.new_delivery(entry_id, _field_map(fields)) for entry_id, fields in entries]
        return deliveries


async def retire_if_gone(streams: AffinityStreams[Any], worker: str, heartbeat: str) -> bool:
    """Delete a gone worker's directory and affinity streams once nothing on them waits; True when done."""
    prefix = streams.prefix
    keys = [heartbeat, blocks_key(prefix, worker), room_key(prefix, worker), workers_key(prefix),
            *(affinity_key(prefix, lane, worker) for lane in LANES)]
    retired = bool(await streams.redis.eval(_RETIRE, len(keys), *keys, streams.group, worker))
    if retired:
        streams.forget(worker)
    return retired


def _field_map(fields: list[bytes] | None) -> dict[bytes, bytes]:
    """A script returns an entry's fields as a flat list [name, value, ...]; consumers expect a map."""
    return dict(zip(fields[::2], fields[1::2], strict=True)) if fields else {}


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
