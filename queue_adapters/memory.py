"""In-memory stream: the embedded default transport, and the fast stand-in for Redis in tests.

Zero-copy: messages are the Python objects the producer sent, handed to the consumer as-is
(numpy arrays included), so a sender must not mutate a message after sending it.

Bounded: `send` waits while `maxsize` messages are queued, which is the backpressure that keeps
a fast actor from running ahead of a slow one. A nack puts the message back at the *front* with
attempt + 1, and may briefly exceed `maxsize`: a consumer handing work back must never block on
its own queue.

Unlike Redis there is no pending list: a delivery that is neither acked nor nacked is simply
gone. That is fine in one process (a crash loses the queue anyway).
"""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from dataclasses import dataclass
from typing import Generic, TypeVar

from queue_adapters.base import Delivery

T = TypeVar("T")


class StreamClosed(RuntimeError):
    """Raised by `send` on a closed stream or producer."""


@dataclass(slots=True)
class _Queued(Generic[T]):
    message: T
    attempt: int
    message_id: str


class MemoryStream(Generic[T]):
    """A bounded FIFO joining any number of producers and consumers in one event loop.

    No lock: every check and change between two awaits runs alone on the loop. A waiter parks a
    future in `_getters` (waiting for an item) or `_putters` (for room) and checks again once woken;
    each change wakes all of its side. One stream's token crosses five of these streams in a worker,
    so each hop is kept to a few Python calls (benchmarks/serve_host_calls.py)."""

    def __init__(self, maxsize: int = 1024, name: str = "memory") -> None:
        if maxsize < 1:
            raise ValueError(f"maxsize must be >= 1, got {maxsize}")
        self.maxsize = maxsize
        self.name = name
        self.closed = False
        self._items: deque[_Queued[T]] = deque()
        self._getters: list[asyncio.Future[None]] = []
        self._putters: list[asyncio.Future[None]] = []
        self._ids = itertools.count()

    def __len__(self) -> int:
        return len(self._items)

    def producer(self) -> MemoryProducer[T]:
        return MemoryProducer(self)

    def consumer(self) -> MemoryConsumer[T]:
        return MemoryConsumer(self)

    async def close(self) -> None:
        """Refuse new messages; consumers drain what is queued, then get empty lists."""
        self.closed = True
        _wake(self._getters)
        _wake(self._putters)

    async def put(self, message: T) -> None:
        while not self.closed and len(self._items) >= self.maxsize:
            await _parked(self._putters, None)
        if self.closed:
            raise StreamClosed(f"stream {self.name} is closed")
        self._items.append(_Queued(message, 1, f"{self.name}-{next(self._ids)}"))
        _wake(self._getters)

    async def take(self, max_count: int, timeout_s: float | None) -> list[Delivery[T]]:
        if max_count < 1:
            raise ValueError(f"max_count must be >= 1, got {max_count}")
        if not await self._wait_for_items(timeout_s):
            return []
        items = self._items
        taken = [items.popleft() for _ in range(min(max_count, len(items)))]
        _wake(self._putters)  # room for producers waiting on a full stream
        return [self._delivery(item) for item in taken]

    async def wait_ready(self) -> bool:
        """Until a message is queued (True) or the stream is closed and drained (False); takes nothing."""
        while not self._items and not self.closed:
            await _parked(self._getters, None)
        return bool(self._items)

    async def _wait_for_items(self, timeout_s: float | None) -> bool:
        """Whether items are there before the timeout (or close)."""
        if self._items or self.closed:
            return bool(self._items)  # the common case under load: no timer to arm and cancel
        if timeout_s is not None and timeout_s <= 0:
            return False  # a poll: nothing there now
        loop = asyncio.get_running_loop()
        deadline = None if timeout_s is None else loop.time() + timeout_s
        while not self._items and not self.closed:
            left = None if deadline is None else deadline - loop.time()
            if left is not None and left <= 0:
                break
            await _parked(self._getters, left)
        return bool(self._items)

    def _delivery(self, item: _Queued[T]) -> Delivery[T]:
        settled = False

        async def ack() -> None:
            nonlocal settled
            settled = True

        async def nack() -> None:
            nonlocal settled
            if settled:
                return  # settling twice must not duplicate the message
            settled = True
            await self._requeue_front(item)

        return Delivery(item.message, item.attempt, item.message_id, ack, nack)

    async def _requeue_front(self, item: _Queued[T]) -> None:
        self._items.appendleft(_Queued(item.message, item.attempt + 1, item.message_id))
        _wake(self._getters)


async def _parked(waiters: list[asyncio.Future[None]], timeout_s: float | None) -> None:
    """Wait until woken through `waiters` (or `timeout_s` passes); the caller checks again."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()
    waiters.append(future)
    timer = None if timeout_s is None else loop.call_later(timeout_s, _wake_one, future)
    try:
        await future
    finally:
        if timer is not None:
            timer.cancel()
        if future in waiters:  # timed out or cancelled, not woken: leave no stale waiter behind
            waiters.remove(future)


def _wake(waiters: list[asyncio.Future[None]]) -> None:
    if waiters:
        woken = waiters.copy()
        waiters.clear()
        for future in woken:
            _wake_one(future)


def _wake_one(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class MemoryProducer(Generic[T]):
    def __init__(self, stream: MemoryStream[T]) -> None:
        self.stream = stream
        self._closed = False

    async def send(self, message: T) -> None:
        if self._closed:
            raise StreamClosed(f"producer of stream {self.stream.name} is closed")
        await self.stream.put(message)

    async def close(self) -> None:
        """Closes this producer only; other producers of the stream keep sending."""
        self._closed = True


class MemoryConsumer(Generic[T]):
    def __init__(self, stream: MemoryStream[T]) -> None:
        self.stream = stream
        self._closed = False

    async def receive(self, max_count: int = 1, timeout_s: float | None = None) -> list[Delivery[T]]:
        if self._closed:
            return []
        return await self.stream.take(max_count, timeout_s)

    async def wait_ready(self) -> bool:
        """Until the stream holds a message (True) or is closed and drained (False), taking nothing:
        for a reader that must take it at a moment of its own choosing."""
        return not self._closed and await self.stream.wait_ready()

    async def close(self) -> None:
        self._closed = True
