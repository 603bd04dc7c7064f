"""Priority lanes: requests queue on one of three streams by their priority, and every worker reads
the most urgent lane first, so an urgent request passes queued bulk work across the whole fleet.

    priority < 0   ->  {prefix}:requests:urgent
    priority == 0  ->  {prefix}:requests            (the stream every client already writes to)
    priority > 0   ->  {prefix}:requests:bulk

Why lanes and not one sorted queue: workers pull, and a Redis stream is FIFO; a sorted set would
need its own delivery tracking, while three streams keep everything the request stream gives
(consumer groups, the pending list that crash resume claims from, acks after the reply). Inside a
worker the scheduler orders the exact priorities (pipeline/scheduling/waiting_queue.py); the lanes
only decide which entries a worker takes first.

A read takes the lanes in order, urgent first. Share: while a less urgent lane is not empty, a read
of k entries leaves it at least one of them when k >= the number of lanes, so bulk work still
advances under a steady urgent load (slowly: that is what priority asks for). When every lane is
empty the worker blocks on all three in one XREADGROUP, which returns at most one entry per lane:
a worker may hold up to two requests beyond its admission room (actors/worker/admission.py).
"""

from __future__ import annotations

import time
from typing import Generic, TypeVar

from queue_adapters.base import Delivery
from queue_adapters.codec import Malformed
from queue_adapters.redis_streams import RedisStreamConsumer, entries_per_stream

T = TypeVar("T")

URGENT, NORMAL, BULK = "urgent", "normal", "bulk"
LANES = (URGENT, NORMAL, BULK)  # in the order workers read them


def lane_of(priority: int) -> str:
    return URGENT if priority < 0 else BULK if priority > 0 else NORMAL


def lane_key(prefix: str, lane: str) -> str:
    return f"{prefix}:requests" if lane == NORMAL else f"{prefix}:requests:{lane}"


def request_key(prefix: str, priority: int) -> str:
    """The stream a request of this priority is queued on."""
    return lane_key(prefix, lane_of(priority))


class LanedConsumer(Generic[T]):
    """One worker's reader of every lane: `receive` as a RedisStreamConsumer's, most urgent first.
    Acks, claims and pending lists stay per lane (`lanes`), where crash resume works as before."""

    def __init__(self, lanes: list[RedisStreamConsumer[T]]) -> None:
        if not lanes:
            raise ValueError("a laned consumer needs at least one lane")
        self.lanes = lanes
        self.consumer_name = lanes[0].consumer_name

    async def ensure_group(self) -> None:
        for lane in self.lanes:
            await lane.ensure_group()

    async def receive(self, max_count: int = 1, timeout_s: float | None = None) -> list[Delivery[T | Malformed]]:
        if max_count < 1:
            raise ValueError(f"max_count must be >= 1, got {max_count}")
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            deliveries = await self._read_in_order(max_count)
            if deliveries:
                return deliveries
            block_ms = self._block_ms_until(deadline)
            if block_ms is None:
                return []
            deliveries = await self._wait_on_all(block_ms)
            if deliveries:
                return deliveries

    def _block_ms_until(self, deadline: float | None) -> int | None:
        block_ms = self.lanes[0].block_ms
        if deadline is None:
            return block_ms
        remaining_ms = int((deadline - time.monotonic()) * 1000)
        return None if remaining_ms <= 0 else min(block_ms, remaining_ms)  # None: do not block

    async def _read_in_order(self, max_count: int) -> list[Delivery[T | Malformed]]:
        """Without blocking: each lane in turn; a read of at least one entry per lane leaves one to
        each later lane. E.g. max_count 8 over (urgent, normal, bulk): urgent takes up to 6, normal
        up to 7 - what urgent took, bulk the rest; max_count 2: the first two entries by lane order."""
        share = max_count >= len(self.lanes)
        deliveries: list[Delivery[T | Malformed]] = []
        for index, lane in enumerate(self.lanes):
            room = max_count - len(deliveries)
            if room <= 0:
                break
            num_later = len(self.lanes) - 1 - index if share else 0
            deliveries += await lane.read_now(max(1, room - num_later))
        return deliveries

    async def _wait_on_all(self, block_ms: int) -> list[Delivery[T | Malformed]]:
        """One blocking XREADGROUP over every lane: at most one entry from each, most urgent first."""
        streams = {lane.stream_key: lane for lane in self.lanes}
        response = await self.lanes[0].read_group(streams, 1, block_ms)
        entries = entries_per_stream(response)
        return [lane.new_delivery(entry_id, fields) for lane in self.lanes
                for entry_id, fields in entries.get(lane.stream_key, []) if entry_id is not None]

    async def close(self) -> None:
        for lane in self.lanes:
            await lane.close()

