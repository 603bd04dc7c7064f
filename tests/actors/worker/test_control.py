"""The control actor forwards every entry issued after it started, however they fall between its reads."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis.asyncio as aioredis

from actors.kit.messages import Cancel
from actors.worker.control import ControlActor
from queue_adapters.codec import WireControl, encode
from queue_adapters.redis_streams import DATA_FIELD

pytestmark = pytest.mark.redis


class Collected:
    def __init__(self) -> None:
        self.messages: list[Any] = []

    async def send(self, message: Any) -> None:
        self.messages.append(message)


async def test_no_entry_is_missed_between_two_reads(redis_url: str, prefix: str) -> None:
    """Reading from `$` on every call skips an entry added while the last batch was being forwarded."""
    client = aioredis.from_url(redis_url)
    key = f"{prefix}:control"
    await client.xadd(key, {DATA_FIELD: encode(WireControl(cancel="before-start"))})
    collected = Collected()
    actor = ControlActor(client, prefix, collected, block_ms=5)
    running = asyncio.create_task(actor.run())
    try:
        await asyncio.sleep(0.1)  # the actor has started reading
        for index in range(200):
            await client.xadd(key, {DATA_FIELD: encode(WireControl(cancel=f"r{index}"))})
            if index % 7 == 0:
                await asyncio.sleep(0.004)  # entries land before, during and after reads
        for _ in range(200):
            if len(collected.messages) >= 200:
                break
            await asyncio.sleep(0.02)
    finally:
        running.cancel()
        await client.aclose()
    assert collected.messages == [Cancel(f"r{index}") for index in range(200)]  # none lost, none from before


async def test_an_entry_added_just_after_an_empty_read_is_forwarded(redis_url: str, prefix: str) -> None:
    """The race made certain: the first read comes back empty and the entry lands before the next one."""
    client = aioredis.from_url(redis_url)
    key = f"{prefix}:control"
    real_xread, calls = client.xread, []

    async def xread_then_add(streams: dict, **options: Any) -> Any:
        calls.append(dict(streams))
        if len(calls) == 1:  # an empty read (its block ran out), then a client issues a cancel
            await client.xadd(key, {DATA_FIELD: encode(WireControl(cancel="in-the-gap"))})
            return []
        return await real_xread(streams, **options)

    client.xread = xread_then_add  # type: ignore[method-assign]
    collected = Collected()
    running = asyncio.create_task(ControlActor(client, prefix, collected, block_ms=5).run())
    try:
        for _ in range(100):
            if collected.messages:
                break
            await asyncio.sleep(0.01)
    finally:
        running.cancel()
        await client.aclose()
    assert collected.messages == [Cancel("in-the-gap")]
