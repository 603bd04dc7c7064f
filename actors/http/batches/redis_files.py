"""Stored files in Redis, shared by every gateway of the deployment:

    {prefix}:file:{id}        a hash: `record` (records.py's JSON) and `data` (the bytes), expiring at the
                              file's expires_at
    {prefix}:files:{owner}    a sorted set: the owner's file ids by the time they were saved (ms), for listing;
                              ids whose hash has expired are dropped when a listing meets them
"""

from __future__ import annotations

import time

import redis.asyncio as aioredis

from actors.http.batches.records import FileRecord


class RedisFileStore:
    def __init__(self, redis: aioredis.Redis, prefix: str) -> None:
        self.redis, self.prefix = redis, prefix

    async def save(self, record: FileRecord, data: bytes) -> None:
        key = self._key(record.id)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.delete(key).hset(key, mapping={"record": record.encode(), "data": data})
            pipe.expireat(key, record.expires_at)
            pipe.zadd(self._index(record.owner), {record.id: int(time.time() * 1000)})
            await pipe.execute()

    async def load(self, owner: str, file_id: str) -> FileRecord | None:
        text = await self.redis.hget(self._key(file_id), "record")
        record = FileRecord.decode(text) if text is not None else None
        return record if record is not None and record.owner == owner else None

    async def content(self, owner: str, file_id: str) -> bytes | None:
        text, data = await self.redis.hmget(self._key(file_id), ["record", "data"])
        if text is None or data is None or FileRecord.decode(text).owner != owner:
            return None
        return bytes(data)

    async def delete(self, owner: str, file_id: str) -> bool:
        if await self.load(owner, file_id) is None:
            return False
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.delete(self._key(file_id)).zrem(self._index(owner), file_id)
            await pipe.execute()
        return True

    async def list(self, owner: str) -> list[FileRecord]:
        ids = [raw.decode() for raw in await self.redis.zrevrange(self._index(owner), 0, -1)]
        if not ids:
            return []
        async with self.redis.pipeline(transaction=False) as pipe:
            for file_id in ids:
                pipe.hget(self._key(file_id), "record")
            texts = await pipe.execute()
        gone = [file_id for file_id, text in zip(ids, texts, strict=True) if text is None]
        if gone:
            await self.redis.zrem(self._index(owner), *gone)
        return [FileRecord.decode(text) for text in texts if text is not None]

    def _key(self, file_id: str) -> str:
        return f"{self.prefix}:file:{file_id}"

    def _index(self, owner: str) -> str:
        return f"{self.prefix}:files:{owner}"
