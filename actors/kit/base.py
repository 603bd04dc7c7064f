"""Actor: an inbox, a handler, a run loop, and a logger bound with the actor's name."""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Iterable
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


TEST_CRASH_ENV = "AQUEDUCT_TEST_CRASH_ACTOR"


def arm_test_crash(actors: Iterable[object]) -> None:
    """Test hook, read when a graph is built: AQUEDUCT_TEST_CRASH_ACTOR=<actor name>:<n> makes that actor
    raise RuntimeError on its n-th message, so tests can see what a dead actor does to its process
    (tests/system/test_actor_death.py). Unset, as everywhere but those tests, nothing is wrapped: no cost."""
    spec = os.environ.get(TEST_CRASH_ENV)
    if not spec:
        return
    name, _, nth = spec.rpartition(":")
    for actor in actors:
        if isinstance(actor, Actor) and actor.name == name:
            _crash_on(actor, int(nth))


def _crash_on(actor: Actor, nth: int) -> None:
    handle, seen = actor.handle, 0

    async def crashing(message: Any) -> None:
        nonlocal seen
        seen += 1
        if seen == nth:
            raise RuntimeError(f"{TEST_CRASH_ENV}: actor {actor.name} crashed on its message {nth}")
        await handle(message)

    actor.handle = crashing  # type: ignore[method-assign]
    actor.log.warning("test hook armed: this actor will crash", env=TEST_CRASH_ENV, nth=nth)
