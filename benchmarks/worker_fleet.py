"""`aqueduct worker` processes a benchmark started on a fresh Redis prefix: waiting for them to register,
and stopping them and clearing the prefix. For benchmarks/placement.py and benchmarks/priority_ttft.py."""

from __future__ import annotations

import asyncio
import subprocess
import time

import redis.asyncio as aioredis


async def wait_ready(redis: aioredis.Redis, prefix: str, count: int, timeout_s: float = 300) -> None:
    """Returns once `count` workers have registered under `prefix`; TimeoutError after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if len([key async for key in redis.scan_iter(f"{prefix}:worker:*")]) >= count:
            return
        await asyncio.sleep(0.5)
    raise TimeoutError("workers did not start")


async def stop_and_clear(workers: list[subprocess.Popen], redis: aioredis.Redis, prefix: str) -> None:
    """Stops the workers, deletes every key under `prefix` (a thousand at a time) and closes `redis`."""
    for worker in workers:
        worker.terminate()
    for worker in workers:
        worker.wait(timeout=60)
    keys = [key async for key in redis.scan_iter(f"{prefix}:*")]
    for start in range(0, len(keys), 1000):
        await redis.delete(*keys[start : start + 1000])
    await redis.aclose()
