"""Helpers for tests that run workers in-process on a real Redis and talk to them like a plain
msgpack client written from docs/design.md §3 alone."""

from __future__ import annotations

import asyncio
import time
from contextlib import asynccontextmanager

import msgpack
import redis.asyncio as aioredis

from actors.worker.run import WorkerOptions, run_worker
from tests.conftest import REDIS_URL
from tests.support.engine_helpers import make_engine


@asynccontextmanager
async def running_workers(model_dir, prefix, count=1, redis_edges=frozenset(), claim_idle_ms=30_000,
                          max_in_flight=None, max_queue_wait_ms=None, reply_to_pattern=None, **engine_kwargs):
    stop = asyncio.Event()
    engines = [make_engine(model_dir, **engine_kwargs) for _ in range(count)]
    options = [WorkerOptions(REDIS_URL, prefix, name=f"w{i}", redis_edges=redis_edges, claim_idle_ms=claim_idle_ms,
                             max_in_flight=max_in_flight, max_queue_wait_ms=max_queue_wait_ms,
                             reply_to_pattern=reply_to_pattern)
               for i in range(count)]
    tasks = [asyncio.create_task(run_worker(engine, option, stop))
             for engine, option in zip(engines, options, strict=True)]
    redis = aioredis.from_url(REDIS_URL)
    try:
        yield redis, engines
    finally:
        stop.set()
        codes = await asyncio.wait_for(asyncio.gather(*tasks), timeout=30)
        keys = [key async for key in redis.scan_iter(f"{prefix}:*")]
        if keys:
            await redis.delete(*keys)
        await redis.aclose()
        assert codes == [0] * count


async def push(redis, prefix, entry):
    """XADD like any client: one field `data` holding a msgpack map (or raw bytes for fuzzing)."""
    data = entry if isinstance(entry, bytes) else msgpack.packb(entry)
    await redis.xadd(f"{prefix}:requests", {"data": data})


async def read_replies(redis, key, timeout_s=60.0):
    """All entries of a reply stream up to the final one (usage or error)."""
    deadline = time.monotonic() + timeout_s
    replies, last_id = [], "0"
    while time.monotonic() < deadline:
        response = await redis.xread({key: last_id}, block=500, count=100)
        for _, entries in response or []:
            for entry_id, fields in entries:
                last_id = entry_id
                reply = msgpack.unpackb(fields[b"data"])
                replies.append(reply)
                if reply.get("usage") is not None or reply.get("error") is not None:
                    return replies
    raise TimeoutError(f"no final entry on {key}; got {replies}")


async def pending_count(redis, prefix, settle_s=2.0):
    """Entries delivered but not acked. Acks follow the final reply write, so allow them a moment."""
    deadline = time.monotonic() + settle_s
    while True:
        pending = (await redis.xpending(f"{prefix}:requests", "workers"))["pending"]
        if pending == 0 or time.monotonic() > deadline:
            return pending
        await asyncio.sleep(0.05)


def tokens_of(replies, index=0):
    return [t for reply in replies for choice in reply["choices"] if choice["index"] == index
            for t in choice["token_ids"]]
