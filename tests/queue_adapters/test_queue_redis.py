"""Redis Streams transport against a real server; every test uses its own key prefix."""

from __future__ import annotations

import asyncio

import msgspec
import pytest
import redis.asyncio as aioredis
from redis.exceptions import ResponseError
from structlog.testing import capture_logs

from queue_adapters.codec import Malformed, WireRequest, decode_request, encode
from queue_adapters.redis_streams import Backoff, RedisStreamConsumer, RedisStreamProducer, dead_letter
from tests.conftest import REDIS_URL

pytestmark = pytest.mark.redis


def make_consumer(prefix: str, name: str = "c1", **kwargs: object) -> RedisStreamConsumer[WireRequest]:
    return RedisStreamConsumer(REDIS_URL, f"{prefix}:requests", "workers", name, decode_request, **kwargs)


def request(number: int) -> WireRequest:
    return WireRequest(id=f"r{number}", prompt=f"prompt {number}")


async def pending_count(client: aioredis.Redis, stream_key: str) -> int:
    return (await client.xpending(stream_key, "workers"))["pending"]


def test_creating_the_group_twice_is_fine_and_other_errors_propagate(prefix: str) -> None:
    async def scenario() -> None:
        consumer = make_consumer(prefix)
        await consumer.ensure_group()
        await consumer.ensure_group()
        await make_consumer(prefix, "c2").ensure_group()
        await consumer.client.set(f"{prefix}:not-a-stream", "x")
        wrong = RedisStreamConsumer(REDIS_URL, f"{prefix}:not-a-stream", "workers", "c1", decode_request)
        with pytest.raises(ResponseError, match="WRONGTYPE"):
            await wrong.ensure_group()
        await consumer.close()
        await wrong.close()

    asyncio.run(scenario())


def test_produce_consume_ack(prefix: str) -> None:
    async def scenario() -> None:
        client = aioredis.Redis.from_url(REDIS_URL)
        producer = RedisStreamProducer(client, f"{prefix}:requests", encode)
        consumer = make_consumer(prefix, client=client)
        await consumer.ensure_group()
        entry_id = await producer.publish(request(0))
        for number in (1, 2):
            await producer.send(request(number))
        deliveries = await consumer.receive(max_count=10, timeout_s=1)
        assert [d.message for d in deliveries] == [request(0), request(1), request(2)]
        assert [d.attempt for d in deliveries] == [1, 1, 1]
        assert deliveries[0].message_id == entry_id
        assert await pending_count(client, f"{prefix}:requests") == 3
        for delivery in deliveries:
            await delivery.ack()
        assert await pending_count(client, f"{prefix}:requests") == 0
        assert await consumer.receive(timeout_s=0.05) == []
        await consumer.close()
        await client.aclose()

    asyncio.run(scenario())


def test_acks_are_not_stuck_behind_a_blocking_read(prefix: str) -> None:
    async def scenario() -> None:
        consumer = make_consumer(prefix, block_ms=5000)
        await consumer.client.xgroup_create(f"{prefix}:requests", "workers", id="0", mkstream=True)
        await consumer.client.xadd(f"{prefix}:requests", {"data": encode(request(0))})
        [delivery] = await consumer.receive(timeout_s=1)
        blocked = asyncio.create_task(consumer.receive(timeout_s=None))
        await asyncio.sleep(0.1)
        await asyncio.wait_for(delivery.ack(), timeout=1)
        assert not blocked.done()
        blocked.cancel()
        await consumer.close()

    asyncio.run(scenario())


def test_unacked_entries_stay_pending_and_claim_stale_redelivers_with_attempt_2(prefix: str) -> None:
    async def scenario() -> None:
        first, second = make_consumer(prefix, "dies"), make_consumer(prefix, "survives")
        await RedisStreamProducer(first.client, f"{prefix}:requests", encode).send(request(0))
        [delivery] = await first.receive(timeout_s=1)
        await delivery.nack()  # leaves it pending
        assert await pending_count(first.client, f"{prefix}:requests") == 1
        assert await second.claim_stale(min_idle_ms=60_000) == []  # not idle long enough
        await asyncio.sleep(0.05)
        [claimed] = await second.claim_stale(min_idle_ms=20)
        assert (claimed.message, claimed.attempt, claimed.message_id) == (request(0), 2, delivery.message_id)
        await asyncio.sleep(0.05)
        [again] = await first.claim_stale(min_idle_ms=20)
        assert again.attempt == 3
        await again.ack()
        assert await pending_count(first.client, f"{prefix}:requests") == 0
        assert await second.claim_stale(min_idle_ms=0) == []
        await first.close()
        await second.close()

    asyncio.run(scenario())


def test_producer_trims_the_stream_to_about_maxlen(prefix: str) -> None:
    async def scenario() -> None:
        client = aioredis.Redis.from_url(REDIS_URL)
        producer = RedisStreamProducer(client, f"{prefix}:requests", encode, maxlen=10)
        for number in range(600):
            await producer.send(request(number))
        length = await client.xlen(f"{prefix}:requests")
        assert 10 <= length < 300  # `~` trims whole radix-tree nodes (100 entries by default)
        await client.aclose()

    asyncio.run(scenario())


def test_malformed_entries_become_malformed_deliveries(prefix: str) -> None:
    async def scenario() -> None:
        consumer = make_consumer(prefix)
        key = f"{prefix}:requests"
        await consumer.ensure_group()
        await consumer.client.xadd(key, {"data": b"\xc1 not msgpack"})
        await consumer.client.xadd(key, {"data": msgspec.msgpack.encode([1, 2])})
        await consumer.client.xadd(key, {"payload": b"x"})
        await consumer.client.xadd(key, {"data": msgspec.msgpack.encode({"id": "r7", "reply_to": "x:out"})})
        await consumer.client.xadd(key, {"data": encode(request(8))})
        deliveries = await consumer.receive(max_count=10, timeout_s=1)
        not_msgpack, not_map, no_data, invalid, valid = (d.message for d in deliveries)
        assert isinstance(not_msgpack, Malformed) and "not valid msgpack" in not_msgpack.error
        assert not_msgpack.raw == b"\xc1 not msgpack" and not_msgpack.entry_id == deliveries[0].message_id
        assert isinstance(not_map, Malformed) and "request must be a map" in not_map.error
        assert isinstance(no_data, Malformed) and no_data.raw is None and "no data field" in no_data.error
        assert isinstance(invalid, Malformed) and (invalid.request_id, invalid.reply_to) == ("r7", "x:out")
        assert valid == request(8)
        dead_id = await dead_letter(consumer.client, prefix, no_data.entry_id, no_data.raw, no_data.error,
                                    source=key)
        [(entry_id, fields)] = await consumer.client.xrange(f"{prefix}:dead")
        assert entry_id.decode() == dead_id
        assert msgspec.msgpack.decode(fields[b"data"]) == {"entry_id": no_data.entry_id, "source": key,
                                                           "reason": no_data.error, "raw": None}
        for delivery in deliveries:
            await delivery.ack()
        await consumer.close()

    asyncio.run(scenario())


def test_consumer_reconnects_after_its_connection_is_killed(prefix: str) -> None:
    async def scenario() -> None:
        consumer = make_consumer(prefix, "victim", block_ms=5000, backoff=Backoff(base_s=0.01, cap_s=0.1))
        await consumer.ensure_group()
        with capture_logs() as logs:
            waiting = asyncio.create_task(consumer.receive(timeout_s=None))
            await asyncio.sleep(0.2)  # now blocked in XREADGROUP
            killed = await consumer.client.client_kill_filter(_type=None, skipme=True, **_reader_filter(
                await consumer.client.client_list(), "aqueduct-reader-victim"))
            assert killed == 1
            await RedisStreamProducer(consumer.client, f"{prefix}:requests", encode).send(request(1))
            [delivery] = await asyncio.wait_for(waiting, timeout=5)
        assert delivery.message == request(1)
        assert any(entry["event"] == "stream read failed, reconnecting" for entry in logs)
        await consumer.close()

    asyncio.run(scenario())


def _reader_filter(clients: list[dict[str, str]], name: str) -> dict[str, str]:
    [reader] = [client for client in clients if client.get("name") == name]
    return {"_id": reader["id"]}


def test_missing_group_is_recreated(prefix: str) -> None:
    async def scenario() -> None:
        consumer = make_consumer(prefix)
        await consumer.ensure_group()
        await consumer.client.delete(f"{prefix}:requests")
        assert await consumer.receive(timeout_s=0.1) == []
        await consumer.client.xadd(f"{prefix}:requests", {"data": encode(request(2))})
        [delivery] = await consumer.receive(timeout_s=1)
        assert delivery.message == request(2)
        await consumer.close()

    asyncio.run(scenario())
