"""Urgent requests behind queued bulk work: their time to first token, loaded vs idle, per policy.

    python benchmarks/priority_ttft.py --workers 1 --bulk 120 --urgent 8

Starts `aqueduct worker` processes (the default model, SmolLM2-135M, unless --model) on a fresh
Redis prefix (127.0.0.1:6379 by default). First the idle figure: the urgent requests (priority 0)
alone, sent together. Then, for each setting, the bulk requests (greedy, `--bulk-tokens` each,
ignore_eos) are queued, and once the workers are busy the urgent ones are sent: their p50/max TTFT,
and the ratio to idle. Settings:
- `bulk at priority 10, --scheduling-policy priority` (the default): the bulk lane and the scheduler;
- `bulk at priority 0`: every request on one FIFO stream, the fleet as it was before priorities.
Workers are restarted between settings, so no prefix cache carries over. Figures depend on the
machine and on what else runs on it: compare the ratios of one run.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
import uuid

import redis.asyncio as aioredis

from queue_adapters.client import AqueductClient
from queue_adapters.codec import WireRequest


def _start_workers(args: argparse.Namespace, prefix: str, policy: str) -> list[subprocess.Popen]:
    model = ["--model", args.model] if args.model else []
    command = [sys.executable, "-m", "actors.cli", "worker", *model, "--redis-url", args.redis_url,
               "--prefix", prefix, "--scheduling-policy", policy, "--log-level", "WARNING", *args.worker_args]
    threads = max(1, (os.cpu_count() or 1) // args.workers)
    return [subprocess.Popen([*command, "--name", f"bench-{index}", "--cpu-threads", str(threads)])
            for index in range(args.workers)]


async def _wait_ready(redis: aioredis.Redis, prefix: str, count: int, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if len([key async for key in redis.scan_iter(f"{prefix}:worker:*")]) >= count:
            return
        await asyncio.sleep(0.5)
    raise TimeoutError("workers did not start")


def _requests(tag: str, count: int, priority: int, max_tokens: int, prompt_words: int) -> list[WireRequest]:
    return [WireRequest(id=f"{tag}-{index}-{uuid.uuid4().hex[:6]}", priority=priority,
                        prompt=" ".join(f"{tag} item {index} word {word}" for word in range(prompt_words)),
                        params={"max_tokens": max_tokens, "temperature": 0, "ignore_eos": True})
            for index in range(count)]


async def _ttfts(client: AqueductClient, requests: list[WireRequest]) -> list[float]:
    started = time.perf_counter()
    await client.submit_many(requests)

    async def first_token(request: WireRequest) -> float:
        async for reply in client.stream(request.id):
            if reply.error is not None:
                raise RuntimeError(f"{request.id}: {reply.error.message}")
            if any(choice.token_ids for choice in reply.choices):
                return time.perf_counter() - started
        raise RuntimeError(f"{request.id}: no token")

    return list(await asyncio.gather(*(first_token(request) for request in requests)))


async def _setting(args: argparse.Namespace, policy: str, bulk_priority: int | None) -> list[float]:
    prefix = f"bench-priority-{uuid.uuid4().hex[:8]}"
    workers = _start_workers(args, prefix, policy)
    redis = aioredis.from_url(args.redis_url)
    try:
        await _wait_ready(redis, prefix, args.workers)
        async with AqueductClient(args.redis_url, prefix) as client:
            await _ttfts(client, _requests("warm", 2, 0, 4, args.prompt_words))
            if bulk_priority is None:
                return await _ttfts(client, _requests("urgent", args.urgent, 0, 16, args.prompt_words))
            bulk = _requests("bulk", args.bulk, bulk_priority, args.bulk_tokens, args.prompt_words)
            await client.submit_many(bulk)
            await asyncio.sleep(args.busy_s)
            ttfts = await _ttfts(client, _requests("urgent", args.urgent, 0, 16, args.prompt_words))
            for request in bulk:
                await client.cancel(request.id)
            return ttfts
    finally:
        for worker in workers:
            worker.terminate()
        for worker in workers:
            worker.wait(timeout=60)
        keys = [key async for key in redis.scan_iter(f"{prefix}:*")]
        if keys:
            await redis.delete(*keys)
        await redis.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="default: the default model; `builtin` is a tiny one")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--bulk", type=int, default=120)
    parser.add_argument("--bulk-tokens", type=int, default=128)
    parser.add_argument("--urgent", type=int, default=8)
    parser.add_argument("--prompt-words", type=int, default=40)
    parser.add_argument("--busy-s", type=float, default=2.0, help="after queueing the bulk, before the urgent")
    parser.add_argument("worker_args", nargs="*", help="more `aqueduct worker` flags, after --")
    args = parser.parse_args()
    idle = asyncio.run(_setting(args, "priority", None))
    idle_p50 = statistics.median(idle)
    print(f"idle fleet: urgent TTFT p50 {idle_p50:.3f} s, max {max(idle):.3f} s")
    for label, policy, bulk_priority in (("bulk at priority 10, policy priority", "priority", 10),
                                         ("bulk at priority 0 (one FIFO lane)", "priority", 0)):
        ttfts = asyncio.run(_setting(args, policy, bulk_priority))
        p50 = statistics.median(ttfts)
        print(f"{label}: urgent TTFT p50 {p50:.3f} s ({p50 / idle_p50:.1f}x idle), max {max(ttfts):.3f} s")


if __name__ == "__main__":
    main()
