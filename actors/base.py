"""Actor: an inbox, a handler, a run loop, and a logger bound with the actor's name."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import structlog

from queue_adapters.base import Consumer


class Actor(ABC):
    """Reads its inbox in batches, handles each message, acks it, then runs `after_batch`.

    `tick_s` bounds how long the actor waits for mail before running `after_batch` anyway
    (None: only when mail arrives). The loop ends when the inbox is closed and drained."""

    tick_s: float | None = None
    batch_size: int = 64

    def __init__(self, name: str, inbox: Consumer[Any]) -> None:
        self.name = name
        self.inbox = inbox
        self.log = structlog.get_logger(__name__).bind(actor=name)

    async def run(self) -> None:
        while True:
            deliveries = await self.inbox.receive(max_count=self.batch_size, timeout_s=self.tick_s)
            if not deliveries and self.tick_s is None:
                return  # closed and drained
            for delivery in deliveries:
                await self.handle(delivery.message)
                await delivery.ack()
            await self.after_batch()

    @abstractmethod
    async def handle(self, message: Any) -> None: ...

    async def after_batch(self) -> None:
        return None
