"""Urgent requests behind queued bulk work: their time to first token, loaded vs idle, per policy.

    python benchmarks/priority_ttft.py --workers 1 --bulk 120 --urgent 8

Starts `aqueduct worker` processes (the default model, SmolLM2-135M, unless --model) on a fresh
Redis prefix (127.0.0.1:6379 by default). First the idle figure: the urgent requests (priority 0)
alone, sent together. Then, for each setting, the bulk requests (greedy, `--bulk-tokens` each,
ignore_eos) are queued, and once the workers are busy the urgent ones are sent: their p50/max TTFT,
and the ratio to idle. Settings:
- `bulk at priority 10, --scheduling-policy priority` (the default): the bulk lane and the scheduler,
  bulk prefill capped per step (--max-bulk-prefill-tokens 512);
- the same without the cap (--max-bulk-prefill-tokens 0);
- `bulk at priority 0`: every request on one FIFO stream, the fleet as it was before priorities.
Workers are restarted between settings, so no prefix cache carries over. With --repeats N the whole
round (idle figure included) runs N times and the median ratios are printed. Figures depend on the
machine and on what else runs on it: compare the ratios of one round.
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
from worker_fleet import stop_and_clear, wait_ready

from queue_adapters.client import AqueductClient
from queue_adapters.codec import WireRequest


def _start_workers(args: argparse.Namespace, prefix: str, flags: tuple[str, ...]) -> list[subprocess.Popen]:
    model = ["--model", args.model] if args.model else []
    command = [sys.executable, "-m", "actors.cli", "worker", *model, "--redis-url", args.redis_url,
               "--prefix", prefix, *flags, "--log-level", "WARNING", *args.worker_args]
    threads = max(1, (os.cpu_count() or 1) // args.workers)
    return [subprocess.Popen([*command, "--name", f"bench-{index}", "--cpu-threads", str(threads)])
            for index in range(args.workers)]


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


async def _setting(args: argparse.Namespace, flags: tuple[str, ...], bulk_priority: int | None) -> list[float]:
    prefix = f"bench-priority-{uuid.uuid4().hex[:8]}"
    workers = _start_workers(args, prefix, flags)
    redis = aioredis.from_url(args.redis_url)
    try:
        await wait_ready(redis, prefix, args.workers)
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
        await stop_and_clear(workers, redis, prefix)


SETTINGS = (  # label, worker flags, the bulk requests' priority
    ("bulk at priority 10, policy priority", (), 10),
    ("bulk at priority 10, no bulk prefill cap", ("--max-bulk-prefill-tokens", "0"), 10),
    ("bulk at priority 0 (one FIFO lane)", (), 0),
)


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
    parser.add_argument("--repeats", type=int, default=1, help="rounds of every setting, each with its own idle figure")
    args = parser.parse_args()
    ratios: dict[str, list[float]] = {label: [] for label, _, _ in SETTINGS}
    for round_index in range(args.repeats):  # a round's ratios share its idle figure: load drifts between rounds
        idle = asyncio.run(_setting(args, (), None))
        idle_p50 = statistics.median(idle)
        print(f"round {round_index + 1}: idle fleet: urgent TTFT p50 {idle_p50:.3f} s, max {max(idle):.3f} s")
        for label, flags, bulk_priority in SETTINGS:
            ttfts = asyncio.run(_setting(args, flags, bulk_priority))
            p50 = statistics.median(ttfts)
            ratios[label].append(p50 / idle_p50)
            print(f"  {label}: urgent TTFT p50 {p50:.3f} s ({p50 / idle_p50:.1f}x idle), max {max(ttfts):.3f} s")
    if args.repeats > 1:
        for label, values in ratios.items():
            print(f"{label}: median {statistics.median(values):.1f}x idle ({', '.join(f'{v:.1f}' for v in values)})")


if __name__ == "__main__":
    main()
