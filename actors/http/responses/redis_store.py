"""Stored responses in Redis, shared by every gateway of the deployment (a conversation started on one
continues on any other, and a gateway's restart loses none):

    {prefix}:resp:{id}               "{tenant}\n{record}" (records.py), expiring after StoreLimits.ttl_s
    {prefix}:resp-index:{tenant}     a sorted set: the tenant's response ids in the order they were saved
                                     (scored by the save's time in ms, each later than the one before)
    {prefix}:resp-sizes:{tenant}     a hash: each of those ids -> its record's size in bytes

A save runs as one script, so gateways saving for one tenant at once cannot both miss its bound: it
forgets ids whose records expired, adds the record, then evicts the tenant's oldest records while it
holds more than `max_responses` or `max_bytes`. Response ids are the server's own (`resp_` and 32
random hex digits), so no client can name a key.
"""

from __future__ import annotations

import time

import redis.asyncio as aioredis

from actors.http.responses.store import DEFAULT_LIMITS, StoreLimits

_SAVE = """
local id, record, now, ttl = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local max_count, max_bytes, record_prefix = tonumber(ARGV[5]), tonumber(ARGV[6]), ARGV[7]
for _, old in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now - ttl * 1000)) do
  redis.call('ZREM', KEYS[2], old)
  redis.call('HDEL', KEYS[3], old)
end
redis.call('SET', KEYS[1], record, 'EX', ttl)
-- Scores order the tenant's saves: one saved in the same millisecond as the newest still sorts after it.
local newest = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
local score = now
if newest[2] and tonumber(newest[2]) >= score then score = tonumber(newest[2]) + 1 end
redis.call('ZADD', KEYS[2], score, id)
redis.call('HSET', KEYS[3], id, #record)
local total = 0
for _, size in ipairs(redis.call('HVALS', KEYS[3])) do total = total + tonumber(size) end
while redis.call('ZCARD', KEYS[2]) > max_count or total > max_bytes do
  local oldest = redis.call('ZRANGE', KEYS[2], 0, 0)[1]
  if oldest == id then break end
  total = total - tonumber(redis.call('HGET', KEYS[3], oldest) or '0')
  redis.call('ZREM', KEYS[2], oldest)
  redis.call('HDEL', KEYS[3], oldest)
  redis.call('DEL', record_prefix .. oldest)
end
redis.call('EXPIRE', KEYS[2], ttl)
redis.call('EXPIRE', KEYS[3], ttl)
"""


class RedisResponseStore:
    def __init__(self, redis: aioredis.Redis, prefix: str, limits: StoreLimits = DEFAULT_LIMITS) -> None:
        self.redis, self.prefix, self.limits = redis, prefix, limits
        self._save = redis.register_script(_SAVE)

    async def save(self, tenant: str, response_id: str, record: str) -> None:
        keys = [self._record_key(response_id), *self._tenant_keys(tenant)]
        limits = self.limits
        await self._save(keys=keys, args=[response_id, f"{tenant}\n{record}", int(time.time() * 1000), limits.ttl_s,
                                          limits.max_responses, limits.max_bytes, f"{self.prefix}:resp:"])

    async def load(self, tenant: str, response_id: str) -> str | None:
        stored = await self.redis.get(self._record_key(response_id))
        if stored is None:
            return None
        owner, _, record = (stored.decode() if isinstance(stored, bytes) else str(stored)).partition("\n")
        return record if owner == tenant else None

    async def delete(self, tenant: str, response_id: str) -> bool:
        if await self.load(tenant, response_id) is None:
            return False
        index, sizes = self._tenant_keys(tenant)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.delete(self._record_key(response_id)).zrem(index, response_id).hdel(sizes, response_id)
            await pipe.execute()
        return True

    def _record_key(self, response_id: str) -> str:
        return f"{self.prefix}:resp:{response_id}"

    def _tenant_keys(self, tenant: str) -> tuple[str, str]:
        return f"{self.prefix}:resp-index:{tenant}", f"{self.prefix}:resp-sizes:{tenant}"

