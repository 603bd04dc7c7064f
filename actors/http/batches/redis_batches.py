"""Stored batches in Redis, shared by every gateway of the deployment (batch_store.py says what each
operation promises):

    {prefix}:batch:{id}          a hash: `record` (records.py's JSON), `completed` and `failed` (line counts),
                                 `cancelling_at` (set once, by whichever gateway was asked to cancel)
    {prefix}:batch:{id}:lines    a hash: line index -> its answer (HSETNX: the first answer stays)
    {prefix}:batch:{id}:lease    the gateway running the batch, expiring unless it renews it
    {prefix}:batches:{owner}     a sorted set: the owner's batch ids by creation time (ms), for listing
    {prefix}:batch-active        a sorted set: the batches not finished, by creation time, for any gateway to
                                 take up (a restarted one resumes its own)

Once finished, a batch leaves the active set, its lines' hash is dropped (the answers are in its result
files) and its record expires after FINISHED_TTL_S.
"""

from __future__ import annotations

import time

import redis.asyncio as aioredis

from actors.http.batches.batch_store import FINISHED_TTL_S
from actors.http.batches.records import BatchRecord

# A line of a batch that is still active, answered once: its answer and its count in one step.
_RECORD_LINE = """
if not redis.call('ZSCORE', KEYS[3], ARGV[4]) then return 0 end
if redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2]) == 1 then
  redis.call('HINCRBY', KEYS[2], ARGV[3], 1)
  return 1
end
return 0
"""
_CLAIM = """
local holder = redis.call('GET', KEYS[1])
if holder and holder ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
"""
_CANCEL = """
if redis.call('EXISTS', KEYS[1]) == 1 then redis.call('HSETNX', KEYS[1], 'cancelling_at', ARGV[1]) end
"""
_FIELDS = ("record", "completed", "failed", "cancelling_at")


class RedisBatchStore:
    def __init__(self, redis: aioredis.Redis, prefix: str) -> None:
        self.redis, self.prefix = redis, prefix
        self._record_line = redis.register_script(_RECORD_LINE)
        self._claim = redis.register_script(_CLAIM)
        self._release = redis.register_script(_RELEASE)
        self._cancel = redis.register_script(_CANCEL)

    async def create(self, record: BatchRecord) -> None:
        now_ms = int(time.time() * 1000)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(self._key(record.id), mapping={"record": record.encode(), "completed": 0, "failed": 0})
            pipe.zadd(self._owner_index(record.owner), {record.id: now_ms})
            pipe.zadd(self._active(), {record.id: now_ms})
            await pipe.execute()

    async def load(self, batch_id: str) -> BatchRecord | None:
        return _decoded(await self.redis.hmget(self._key(batch_id), _FIELDS))

    async def save(self, record: BatchRecord) -> None:
        key = self._key(record.id)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(key, "record", record.encode())
            if record.finished:
                pipe.delete(f"{key}:lines").zrem(self._active(), record.id).expire(key, FINISHED_TTL_S)
            await pipe.execute()

    async def list(self, owner: str) -> list[BatchRecord]:
        ids = [raw.decode() for raw in await self.redis.zrevrange(self._owner_index(owner), 0, -1)]
        if not ids:
            return []
        async with self.redis.pipeline(transaction=False) as pipe:
            for batch_id in ids:
                pipe.hmget(self._key(batch_id), _FIELDS)
            found = [_decoded(values) for values in await pipe.execute()]
        gone = [batch_id for batch_id, record in zip(ids, found, strict=True) if record is None]
        if gone:
            await self.redis.zrem(self._owner_index(owner), *gone)
        return [record for record in found if record is not None]

    async def request_cancel(self, batch_id: str, at: int) -> None:
        await self._cancel(keys=[self._key(batch_id)], args=[at])

    async def record_line(self, batch_id: str, index: int, line: str, ok: bool) -> bool:
        key = self._key(batch_id)
        kept = await self._record_line(keys=[f"{key}:lines", key, self._active()],
                                       args=[index, line, "completed" if ok else "failed", batch_id])
        return bool(kept)

    async def answered(self, batch_id: str) -> set[int]:
        return {int(index) for index in await self.redis.hkeys(f"{self._key(batch_id)}:lines")}

    async def lines(self, batch_id: str, start: int, stop: int) -> list[str | None]:
        if stop <= start:
            return []
        values = await self.redis.hmget(f"{self._key(batch_id)}:lines", list(range(start, stop)))
        return [value.decode() if value is not None else None for value in values]

    async def active(self) -> list[str]:
        return [raw.decode() for raw in await self.redis.zrange(self._active(), 0, -1)]

    async def claim(self, batch_id: str, holder: str, ttl_s: float) -> bool:
        return bool(await self._claim(keys=[self._lease(batch_id)], args=[holder, max(1, int(ttl_s * 1000))]))

    async def release(self, batch_id: str, holder: str) -> None:
        await self._release(keys=[self._lease(batch_id)], args=[holder])

    def _key(self, batch_id: str) -> str:
        return f"{self.prefix}:batch:{batch_id}"

    def _lease(self, batch_id: str) -> str:
        return f"{self._key(batch_id)}:lease"

    def _owner_index(self, owner: str) -> str:
        return f"{self.prefix}:batches:{owner}"

    def _active(self) -> str:
        return f"{self.prefix}:batch-active"


def _decoded(values: list[bytes | None]) -> BatchRecord | None:
    text, completed, failed, cancelling_at = values
    if text is None:
        return None
    record = BatchRecord.decode(text)
    record.completed, record.failed = int(completed or 0), int(failed or 0)
    record.cancelling_at = int(cancelling_at) if cancelling_at is not None else None
    return record
