"""MemoryStream: FIFO order, bounded backpressure, nack redelivery at the front with attempt + 1."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from queue_adapters.base import Consumer, Producer
from queue_adapters.memory import MemoryStream, StreamClosed


def test_messages_arrive_in_send_order_and_as_the_same_objects() -> None:
    async def scenario() -> None:
        stream: MemoryStream[object] = MemoryStream(maxsize=8)
        producer: Producer[object] = stream.producer()
        consumer: Consumer[object] = stream.consumer()
        array = np.arange(4)
        messages = [array, "b", {"c": 1}]
        for message in messages:
            await producer.send(message)
        deliveries = await consumer.receive(max_count=10, timeout_s=0)
        assert [d.message for d in deliveries] == messages
        assert deliveries[0].message is array  # zero-copy
        assert [d.attempt for d in deliveries] == [1, 1, 1]
        assert len({d.message_id for d in deliveries}) == 3

    asyncio.run(scenario())


def test_receive_respects_max_count_and_times_out_empty() -> None:
    async def scenario() -> None:
        stream: MemoryStream[int] = MemoryStream()
        for number in range(5):
            await stream.producer().send(number)
        consumer = stream.consumer()
        assert [d.message for d in await consumer.receive(max_count=2)] == [0, 1]
        assert [d.message for d in await consumer.receive(max_count=10)] == [2, 3, 4]
        assert await consumer.receive(timeout_s=0.01) == []
        assert await consumer.receive(timeout_s=0) == []  # a poll of an empty stream
        await stream.producer().send(5)
        assert [d.message for d in await consumer.receive(timeout_s=0)] == [5]

    asyncio.run(scenario())


def test_receive_waits_for_a_message_sent_later() -> None:
    async def scenario() -> None:
        stream: MemoryStream[str] = MemoryStream()
        waiting = asyncio.create_task(stream.consumer().receive(timeout_s=None))
        await asyncio.sleep(0.01)
        assert not waiting.done()
        await stream.producer().send("late")
        assert [d.message for d in await waiting] == ["late"]

    asyncio.run(scenario())


def test_send_blocks_while_full_until_a_consumer_takes_one() -> None:
    async def scenario() -> None:
        stream: MemoryStream[int] = MemoryStream(maxsize=2)
        producer = stream.producer()
        await producer.send(1)
        await producer.send(2)
        third = asyncio.create_task(producer.send(3))
        await asyncio.sleep(0.01)
        assert not third.done() and len(stream) == 2  # backpressure
        await stream.consumer().receive()
        await asyncio.wait_for(third, timeout=1)
        assert len(stream) == 2

    asyncio.run(scenario())


def test_nack_redelivers_first_with_attempt_incremented() -> None:
    async def scenario() -> None:
        stream: MemoryStream[str] = MemoryStream(maxsize=2)
        producer, consumer = stream.producer(), stream.consumer()
        await producer.send("a")
        await producer.send("b")
        [first] = await consumer.receive()
        await producer.send("c")  # the queue is full again: nack must still not block
        await first.nack()
        await first.nack()  # settling twice is a no-op, not a duplicate
        again = await consumer.receive(max_count=10)
        assert [(d.message, d.attempt) for d in again] == [("a", 2), ("b", 1), ("c", 1)]
        assert again[0].message_id == first.message_id
        await again[0].nack()
        [third_try] = await consumer.receive()
        assert (third_try.message, third_try.attempt) == ("a", 3)

    asyncio.run(scenario())


def test_nack_after_ack_does_nothing() -> None:
    async def scenario() -> None:
        stream: MemoryStream[str] = MemoryStream()
        await stream.producer().send("a")
        [delivery] = await stream.consumer().receive()
        await delivery.ack()
        await delivery.nack()
        assert len(stream) == 0

    asyncio.run(scenario())


def test_closed_stream_drains_then_returns_empty_and_refuses_sends() -> None:
    async def scenario() -> None:
        stream: MemoryStream[int] = MemoryStream()
        await stream.producer().send(1)
        consumer = stream.consumer()
        idle = asyncio.create_task(stream.consumer().receive(timeout_s=None))
        await asyncio.sleep(0)
        await stream.close()
        assert [d.message for d in await consumer.receive()] + [d.message for d in await idle] == [1]
        assert await consumer.receive(timeout_s=None) == []
        with pytest.raises(StreamClosed):
            await stream.producer().send(2)

    asyncio.run(scenario())


def test_closed_producer_refuses_sends() -> None:
    async def scenario() -> None:
        producer = MemoryStream[int]().producer()
        await producer.close()
        with pytest.raises(StreamClosed):
            await producer.send(1)

    asyncio.run(scenario())


def test_maxsize_must_be_positive() -> None:
    with pytest.raises(ValueError, match="maxsize must be >= 1"):
        MemoryStream(maxsize=0)


def test_wait_ready_waits_for_a_message_without_taking_it_and_ends_when_closed() -> None:
    async def scenario() -> None:
        stream: MemoryStream[str] = MemoryStream()
        consumer = stream.consumer()
        waiting = asyncio.create_task(consumer.wait_ready())
        await asyncio.sleep(0.01)
        assert not waiting.done()
        await stream.producer().send("route")
        assert await waiting is True
        assert await consumer.wait_ready() is True  # still there: nothing was taken
        assert [d.message for d in await consumer.receive(timeout_s=0)] == ["route"]
        await stream.close()
        assert await consumer.wait_ready() is False  # closed and drained

    asyncio.run(scenario())


def test_waiters_that_time_out_or_are_cancelled_leave_nothing_behind():
    """An idle consumer polls with a timeout again and again: its expired waits must not pile up."""
    async def main() -> None:
        stream: MemoryStream[int] = MemoryStream(maxsize=1)
        for _ in range(50):
            assert await stream.take(1, timeout_s=0.001) == []
        waiting = asyncio.create_task(stream.take(1, timeout_s=None))
        await asyncio.sleep(0)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        await stream.put(1)
        blocked = asyncio.create_task(stream.put(2))  # full: waits for room
        await asyncio.sleep(0)
        blocked.cancel()
        with pytest.raises(asyncio.CancelledError):
            await blocked
        assert stream._getters == [] and stream._putters == []
        assert [d.message for d in await stream.take(4, timeout_s=0)] == [1]

    asyncio.run(main())
