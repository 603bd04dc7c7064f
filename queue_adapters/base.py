"""The streams that join actors: Producer / Consumer protocols and the Delivery they hand out.

A Delivery carries one message plus how to settle it: `ack` once the work it stands for is
durable, `nack` to hand it back for redelivery. `attempt` counts deliveries (1 = first), so a
consumer can dead-letter poison messages.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)
T_contra = TypeVar("T_contra", contravariant=True)


async def _settled() -> None:
    return None


@dataclass(slots=True)
class Delivery(Generic[T]):
    message: T
    attempt: int = 1
    message_id: str | None = None  # transport id (a Redis stream entry id), if any
    _ack: Callable[[], Awaitable[None]] = field(default=_settled, repr=False)
    _nack: Callable[[], Awaitable[None]] = field(default=_settled, repr=False)

    async def ack(self) -> None:
        await self._ack()

    async def nack(self) -> None:
        await self._nack()


class Producer(Protocol[T_contra]):
    async def send(self, message: T_contra) -> None: ...

    async def close(self) -> None: ...


class Consumer(Protocol[T_co]):
    async def receive(self, max_count: int = 1, timeout_s: float | None = None) -> list[Delivery[T_co]]:
        """Up to max_count deliveries; waits up to timeout_s (None = until one arrives) for the first."""
        ...

    async def close(self) -> None: ...
