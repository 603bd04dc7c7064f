"""`aqueduct bench-redis`: what the Redis path costs, measured side by side in one process.

1. Added time to first token at low load: the same single requests, one at a time, through the
   actor graph with memory intake/replies (the embedded path) and through a worker on Redis with
   a plain client (XADD, then XREAD on the reply stream). Reports medians and p90s.
2. Throughput: the same workload through `aqueduct batch`'s embedded graph and through a worker
   on Redis fed by the client. Reports useful tokens/s and the ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable

import redis.asyncio as aioredis
import structlog

from actors.bench import make_workload
from actors.engine_args import engine_config_from_args
from actors.replies import MemoryReplySink
from actors.runtime import ActorRuntime
from actors.worker import WorkerOptions, build_graph, run_worker
from pipeline.engine import LLMEngine
from queue_adapters.client import AqueductClient
from queue_adapters.codec import Malformed, WireRequest
from queue_adapters.memory import MemoryStream

log = structlog.get_logger(__name__)


def _requests(workload, tag: str) -> list[WireRequest]:
    return [WireRequest(id=f"{tag}-{i}", prompt_token_ids=prompt,
                        params={"max_tokens": output_len, "temperature": 0.0, "ignore_eos": True})
            for i, (prompt, output_len) in enumerate(zip(workload.prompts, workload.output_lens, strict=True))]


async def _memory_path(engine: LLMEngine, ttft_requests: list[WireRequest], load: list[WireRequest],
                       ) -> tuple[list[float], float]:
    inbox: MemoryStream[WireRequest | Malformed] = MemoryStream()
    sink = MemoryReplySink()

    async def no_dead_letters(message: Malformed) -> None:
        raise AssertionError(message.error)

    graph = build_graph(engine, inbox.consumer(), sink, "bench", no_dead_letters,
                        2 * engine.config.scheduler.max_num_seqs)
    runtime = ActorRuntime(graph.actors, graph.intake, graph.admission.wait_idle, 5.0)
    stop = asyncio.Event()
    runtime.stop_when(stop)
    running = asyncio.create_task(runtime.run())
    producer = inbox.producer()

    async def submit_and_first(request: WireRequest) -> None:
        await producer.send(request)
        await sink.wait_first(f"bench:out:{request.id}")

    async def submit_and_finish(request: WireRequest) -> None:
        await producer.send(request)
        await sink.wait_final(f"bench:out:{request.id}")

    ttfts = await _sequential_ttft(ttft_requests, submit_and_first, lambda r: sink.wait_final(f"bench:out:{r.id}"))
    seconds = await _throughput(load, submit_and_finish)
    stop.set()
    await running
    return ttfts, seconds


async def _redis_path(engine: LLMEngine, redis_url: str, ttft_requests: list[WireRequest],
                      load: list[WireRequest]) -> tuple[list[float], float]:
    prefix = f"bench-{uuid.uuid4().hex[:8]}"
    stop = asyncio.Event()
    worker = asyncio.create_task(run_worker(engine, WorkerOptions(redis_url, prefix, name="bench"), stop))
    redis = aioredis.from_url(redis_url)
    await asyncio.sleep(0.5)  # let the worker create its group and start reading
    try:
        async with AqueductClient(redis_url, prefix) as client:

            async def submit_and_first(request: WireRequest) -> None:
                await client.submit(request)
                key = f"{prefix}:out:{request.id}"
                while not await redis.xread({key: "0"}, block=1000, count=1):
                    pass

            async def submit_and_finish(request: WireRequest) -> None:
                await client.submit(request)
                await client.result(request.id)

            ttfts = await _sequential_ttft(ttft_requests, submit_and_first, lambda r: client.result(r.id))
            seconds = await _throughput(load, submit_and_finish)
    finally:
        stop.set()
        await worker
        keys = [key async for key in redis.scan_iter(f"{prefix}:*")]
        if keys:
            await redis.delete(*keys)
        await redis.aclose()
    return ttfts, seconds


async def _sequential_ttft(requests: list[WireRequest], first: Callable[[WireRequest], Awaitable[None]],
                           finish: Callable[[WireRequest], Awaitable[object]]) -> list[float]:
    ttfts = []
    for request in requests:
        started = time.perf_counter()
        await first(request)
        ttfts.append(time.perf_counter() - started)
        await finish(request)  # low load: one request at a time
    return ttfts


async def _throughput(requests: list[WireRequest], run_one: Callable[[WireRequest], Awaitable[None]]) -> float:
    started = time.perf_counter()
    await asyncio.gather(*(run_one(request) for request in requests))
    return time.perf_counter() - started


def _ms(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q * 100) - 1] * 1000 if len(values) > 1 else values[0] * 1000


def run_bench_redis(args: argparse.Namespace) -> None:
    engine = LLMEngine(engine_config_from_args(args))
    small = make_workload(args.num_ttft, (16, 64), (2, 2), engine.vocab_size, seed=3)
    load = make_workload(args.num_requests, tuple(args.prompt_len), tuple(args.output_len), engine.vocab_size, seed=0)
    warm = make_workload(4, (8, 16), (2, 4), engine.vocab_size, seed=9)
    results = {}
    for label in ("memory", "redis"):
        tag = uuid.uuid4().hex[:6]
        ttft_requests, load_requests = _requests(small, f"t{tag}"), _requests(load, f"l{tag}")
        if label == "memory":
            asyncio.run(_memory_path(engine, _requests(warm, f"w{tag}"), []))
            results[label] = asyncio.run(_memory_path(engine, ttft_requests, load_requests))
        else:
            results[label] = asyncio.run(_redis_path(engine, args.redis_url, ttft_requests, load_requests))
    memory_ttft, memory_seconds = results["memory"]
    redis_ttft, redis_seconds = results["redis"]
    print(f"time to first token, {args.num_ttft} single requests one at a time (prompt 16-64, 2 tokens):")
    for label, ttfts in (("memory", memory_ttft), ("redis", redis_ttft)):
        print(f"  {label:6s} p50 {_ms(ttfts, 0.5):7.2f} ms   p90 {_ms(ttfts, 0.9):7.2f} ms")
    print(f"  added by Redis: p50 {_ms(redis_ttft, 0.5) - _ms(memory_ttft, 0.5):+.2f} ms")
    tokens = load.useful_tokens
    print(f"throughput, {args.num_requests} requests, prompt {args.prompt_len[0]}-{args.prompt_len[1]}, "
          f"output {args.output_len[0]}-{args.output_len[1]} ({tokens} tokens):")
    print(f"  embedded graph (aqueduct batch) {tokens / memory_seconds:8.1f} tokens/s")
    print(f"  worker via Redis               {tokens / redis_seconds:8.1f} tokens/s")
    print(f"  ratio worker / batch: {memory_seconds / redis_seconds:.2f}x")
