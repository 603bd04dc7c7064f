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

With prefix placement (queue_adapters/placement.py, stealing.py) a lane is three sources, read in
this order: the worker's own affinity stream of the lane (offers made to it), other workers' offers
that waited past the placement wait, then the shared lane. While the worker has nothing to read it
blocks at most the placement wait, so an offer its worker leaves unread is taken soon after.

A read takes the lanes in order, urgent first. Share: while a less urgent lane is not empty, a read
of k entries leaves it at least one of them when k >= the number of lanes, so bulk work still
advances under a steady urgent load (slowly: that is what priority asks for). When every lane is
empty the worker blocks on all three (and its three affinity streams) in one XREADGROUP, which
returns at most one entry per stream: a worker may hold up to two requests beyond its admission room
(five with placement; actors/worker/admission.py).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from queue_adapters.base import Delivery
from queue_adapters.codec import Malformed
from queue_adapters.redis_streams import RedisStreamConsumer, entries_per_stream

T = TypeVar("T")

URGENT, NORMAL, BULK = "urgent", "normal", "bulk"
LANES = (URGENT, NORMAL, BULK)  # in the order workers read them
OFFERED, STOLEN, SHARED = "offered", "stolen", "shared"  # where a worker took a request from


class LaneStealer(Protocol):
    async def steal(self, max_count: int, workers: list[str]) -> list[Delivery[Any]]: ...


@dataclass(slots=True)
class LanePlacement:
    """A worker's part in prefix placement, one item per lane in LANES order."""
    own: list[RedisStreamConsumer[Any]]  # its affinity streams
    stealers: list[LaneStealer]  # takers of other workers' waiting offers
    other_workers: Callable[[], Awaitable[list[str]]]  # the workers whose offers may be taken
    wait_ms: int  # the placement wait: how long an offer waits for its worker


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

    def __init__(self, lanes: list[RedisStreamConsumer[T]], placement: LanePlacement | None = None,
                 on_taken: Callable[[str, int], None] | None = None) -> None:
        if not lanes:
            raise ValueError("a laned consumer needs at least one lane")
        if placement is not None and not len(placement.own) == len(placement.stealers) == len(lanes):
            raise ValueError("placement needs one affinity stream and one stealer per lane")
        self.lanes = lanes
        self.placement = placement
        self.consumer_name = lanes[0].consumer_name
        self.taken: Counter[str] = Counter()  # requests read by source: OFFERED, STOLEN, SHARED
        self.on_taken = on_taken  # told of each read's count by source (the worker's metrics)

    async def ensure_group(self) -> None:
        for lane in [*self.lanes, *(self.placement.own if self.placement else [])]:
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
        if self.placement is not None:
            block_ms = min(block_ms, max(1, self.placement.wait_ms))
        if deadline is None:
            return block_ms
        remaining_ms = int((deadline - time.monotonic()) * 1000)
        return None if remaining_ms <= 0 else min(block_ms, remaining_ms)  # None: do not block

    async def _read_in_order(self, max_count: int) -> list[Delivery[T | Malformed]]:
        """Without blocking: each lane in turn; a read of at least one entry per lane leaves one to
        each later lane. E.g. max_count 8 over (urgent, normal, bulk): urgent takes up to 6, normal
        up to 7 - what urgent took, bulk the rest; max_count 2: the first two entries by lane order."""
        share = max_count >= len(self.lanes)
        workers = await self.placement.other_workers() if self.placement is not None else []
        deliveries: list[Delivery[T | Malformed]] = []
        for index, lane in enumerate(self.lanes):
            room = max_count - len(deliveries)
            if room <= 0:
                break
            num_later = len(self.lanes) - 1 - index if share else 0
            deliveries += await self._read_lane(index, lane, max(1, room - num_later), workers)
        return deliveries

    async def _read_lane(self, index: int, lane: RedisStreamConsumer[T], most: int,
                         workers: list[str]) -> list[Delivery[T | Malformed]]:
        """Up to `most` entries of one lane: offers to this worker, waiting offers to others, shared."""
        taken: list[Delivery[T | Malformed]] = []
        if self.placement is not None:
            taken += self._count(OFFERED, await self.placement.own[index].read_now(most))
            if len(taken) < most:
                taken += self._count(STOLEN, await self.placement.stealers[index].steal(most - len(taken), workers))
        if len(taken) < most:
            taken += self._count(SHARED, await lane.read_now(most - len(taken)))
        return taken

    def _count(self, source: str, deliveries: list[Delivery[Any]]) -> list[Delivery[Any]]:
        if deliveries:
            self.taken[source] += len(deliveries)
            if self.on_taken is not None:
                self.on_taken(source, len(deliveries))
        return deliveries

    async def _wait_on_all(self, block_ms: int) -> list[Delivery[T | Malformed]]:
        """One blocking XREADGROUP over every lane (and this worker's affinity streams): at most one
        entry from each, most urgent first."""
        own = self.placement.own if self.placement is not None else []
        sources = [(source, OFFERED) for source in own] + [(lane, SHARED) for lane in self.lanes]
        response = await self.lanes[0].read_group({source.stream_key: source for source, _ in sources}, 1, block_ms)
        entries = entries_per_stream(response)
        found = [(source, kind, entry_id, fields) for source, kind in sources
                 for entry_id, fields in entries.get(source.stream_key, []) if entry_id is not None]
        found.sort(key=lambda item: _lane_rank(item[0].stream_key, self.lanes))
        return [self._count(kind, [source.new_delivery(entry_id, fields)])[0]
                for source, kind, entry_id, fields in found]

    async def close(self) -> None:
        for lane in [*self.lanes, *(self.placement.own if self.placement else [])]:
            await lane.close()


def _lane_rank(stream_key: str, lanes: list[RedisStreamConsumer[Any]]) -> int:
    """The lane index of a shared lane or an affinity stream on it (`{lane}:at:{worker}`)."""
    for index, lane in enumerate(lanes):
        if stream_key == lane.stream_key or stream_key.startswith(f"{lane.stream_key}:at:"):
            return index
    return len(lanes)

