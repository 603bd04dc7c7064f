"""The batch and file stores, in memory (embedded) and in Redis (gateways), held to the same promises: a line is
answered once however many runners answer it, and counted once; one runner holds a batch at a time; a finished
batch leaves the active list; another owner sees nothing."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from actors.http.batches.batch_store import BatchStore, MemoryBatchStore
from actors.http.batches.file_store import FileStore, MemoryFileStore
from actors.http.batches.records import BatchRecord, FileRecord, new_batch_id, new_file_id
from actors.http.batches.redis_batches import RedisBatchStore
from actors.http.batches.redis_files import RedisFileStore


@pytest.fixture(params=["memory", "redis"])
async def stores(request: pytest.FixtureRequest) -> AsyncIterator[tuple[BatchStore, FileStore]]:
    if request.param == "memory":
        yield MemoryBatchStore(), MemoryFileStore()
        return
    redis_url, prefix = request.getfixturevalue("redis_url"), request.getfixturevalue("prefix")
    redis = aioredis.Redis.from_url(redis_url)
    yield RedisBatchStore(redis, prefix), RedisFileStore(redis, prefix)
    await redis.aclose()


def _batch(owner: str = "acme", total: int = 3) -> BatchRecord:
    now = int(time.time())
    return BatchRecord(id=new_batch_id(), owner=owner, endpoint="/v1/completions", input_file_id=new_file_id(),
                       completion_window="24h", created_at=now, expires_at=now + 86400, total=total)


async def test_a_line_is_answered_and_counted_once_whoever_answers_it(stores) -> None:
    batches, _ = stores
    record = _batch()
    await batches.create(record)
    kept = await asyncio.gather(*(batches.record_line(record.id, 1, f"+answer {i}", True) for i in range(10)))
    assert sum(kept) == 1
    assert await batches.record_line(record.id, 0, "-refused", False)
    loaded = await batches.load(record.id)
    assert (loaded.completed, loaded.failed) == (1, 1)
    assert await batches.answered(record.id) == {0, 1}
    winner = [f"+answer {i}" for i, was_kept in enumerate(kept) if was_kept]
    assert await batches.lines(record.id, 0, 3) == ["-refused", *winner, None]


async def test_a_finished_batch_leaves_the_active_list_and_takes_no_more_answers(stores) -> None:
    batches, _ = stores
    record = _batch()
    await batches.create(record)
    assert record.id in await batches.active()
    record.status = "completed"
    await batches.save(record)
    assert record.id not in await batches.active()
    assert not await batches.record_line(record.id, 2, "+late", True)
    assert (await batches.load(record.id)).status == "completed"


async def test_one_holder_at_a_time_until_its_lease_lapses_or_it_lets_go(stores) -> None:
    batches, _ = stores
    record = _batch()
    await batches.create(record)
    assert await batches.claim(record.id, "a", 0.3)
    assert await batches.claim(record.id, "a", 0.3)  # renewed
    assert not await batches.claim(record.id, "b", 0.3)
    await asyncio.sleep(0.4)
    assert await batches.claim(record.id, "b", 5)
    await batches.release(record.id, "a")  # not a's any more: nothing happens
    assert not await batches.claim(record.id, "a", 5)
    await batches.release(record.id, "b")
    assert await batches.claim(record.id, "a", 5)


async def test_a_cancel_is_kept_apart_from_the_record_and_its_first_time_stays(stores) -> None:
    batches, _ = stores
    record = _batch()
    await batches.create(record)
    await batches.request_cancel(record.id, 100)
    await batches.request_cancel(record.id, 200)
    await batches.save(record)  # the runner's save does not undo it
    loaded = await batches.load(record.id)
    assert loaded.cancelling_at == 100 and loaded.shown_status() == "cancelling"
    await batches.request_cancel(new_batch_id(), 1)  # unknown: nothing
    assert await batches.load(new_batch_id()) is None


async def test_owners_see_only_their_own(stores) -> None:
    batches, files = stores
    mine, theirs = _batch("acme"), _batch("globex")
    for record in (mine, theirs):
        await batches.create(record)
    assert [record.id for record in await batches.list("acme")] == [mine.id]
    file = FileRecord(new_file_id(), "acme", 3, int(time.time()), "a.jsonl", "batch", int(time.time()) + 60)
    await files.save(file, b"abc")
    assert await files.load("acme", file.id) == file and await files.content("acme", file.id) == b"abc"
    assert await files.load("globex", file.id) is None and await files.content("globex", file.id) is None
    assert not await files.delete("globex", file.id)
    assert [f.id for f in await files.list("acme")] == [file.id] and await files.list("globex") == []
    assert await files.delete("acme", file.id)
    assert await files.load("acme", file.id) is None and await files.list("acme") == []
