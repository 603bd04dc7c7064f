"""Admission control: a worker takes new requests only while it has room for them.

Room = requests in flight (admitted, not yet answered) below `max_in_flight`. Requests beyond
that stay in Redis, where idle workers can take them. Intake waits on `room()`; Output calls
`release()` when a request's final reply is written. The in-flight ids also catch a request id
submitted again while the first is running: it is not generated twice.
"""

from __future__ import annotations

import asyncio


class Admission:
    def __init__(self, max_in_flight: int) -> None:
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight must be >= 1, got {max_in_flight}")
        self.max_in_flight = max_in_flight
        self.in_flight_ids: set[str] = set()
        self._changed = asyncio.Condition()

    @property
    def in_flight(self) -> int:
        return len(self.in_flight_ids)

    async def room(self) -> int:
        """Wait until at least one more request fits; returns how many do."""
        async with self._changed:
            await self._changed.wait_for(lambda: self.in_flight < self.max_in_flight)
            return self.max_in_flight - self.in_flight

    def take(self, request_id: str) -> None:
        self.in_flight_ids.add(request_id)

    async def release(self, request_id: str) -> None:
        async with self._changed:
            self.in_flight_ids.discard(request_id)
            self._changed.notify_all()

    async def wait_idle(self) -> None:
        async with self._changed:
            await self._changed.wait_for(lambda: self.in_flight == 0)
