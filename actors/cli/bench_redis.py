"""`aqueduct bench-redis`: what the Redis path costs, measured side by side in one process.

Two engines on the same weights: one behind the actor graph with memory intake and replies (the
embedded path of `aqueduct batch`), one behind a worker on Redis fed by a client.
1. Added time to first token at low load: single requests, one at a time, alternating between
   the two paths so machine noise hits both alike. Reports p50/p90 and the p50 difference.
2. Throughput: the same workload through each path (Redis: all replies on one shared stream,
   read by one reader, as a high-throughput client would). Reports tokens/s and the ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid

import msgspec
import redis.asyncio as aioredis
import structlog

from actors.cli.bench import make_workload
from actors.cli.engine_args import engine_config_from_args
from actors.kit import event_loop
from actors.kit.runtime import ActorRuntime
from actors.worker.replies import MemoryReplySink
from actors.worker.run import WorkerOptions, build_graph, run_worker
from pipeline.engine import LLMEngine
from queue_adapters.client import AqueductClient
from queue_adapters.codec import Malformed, WireRequest, decode_reply
from queue_adapters.memory import MemoryStream
from queue_adapters.redis_streams import DATA_FIELD

log = structlog.get_logger(__name__)

def _requests(workload, tag: str) -> list[WireRequest]:
    return [WireRequest(id=f"{tag}-{i}", prompt_token_ids=prompt,
                        params={"max_tokens": output_len, "temperature": 0.0, "ignore_eos": True})
            for i, (prompt, output_len) in enumerate(zip(workload.prompts, workload.output_lens, strict=True))]


class MemoryPath:
    """The embedded actor graph: memory intake, memory replies."""

    def __init__(self, engine: LLMEngine) -> None:
        self.inbox: MemoryStream[WireRequest | Malformed] = MemoryStream()
        self.sink = MemoryReplySink()
        graph = build_graph(engine, self.inbox.consumer(), self.sink, "bench", self._no_dead_letters,
                            2 * engine.config.scheduler.max_num_seqs)
        self.runtime = ActorRuntime(graph.actors, graph.intake, graph.admission.wait_idle, 5.0)
        self.stop = asyncio.Event()
        self.runtime.stop_when(self.stop)
        self.producer = self.inbox.producer()
        self.task = asyncio.create_task(self.runtime.run())

    @staticmethod
    async def _no_dead_letters(message: Malformed) -> None:
        raise AssertionError(message.error)

    async def single(self, request: WireRequest) -> float:
        """Seconds to the first reply entry; returns once the request has finished."""
        started = time.perf_counter()
        await self.producer.send(request)
        await self.sink.wait_first(f"bench:out:{request.id}")
        first = time.perf_counter() - started
        await self.sink.wait_final(f"bench:out:{request.id}")
        return first

    async def finish(self, request: WireRequest) -> None:
        await self.producer.send(request)
        await self.sink.wait_final(f"bench:out:{request.id}")

    async def throughput(self, requests: list[WireRequest]) -> float:
        started = time.perf_counter()
        await asyncio.gather(*(self.finish(request) for request in requests))
        return time.perf_counter() - started

    async def close(self) -> None:
        self.stop.set()
        await self.task


class RedisPath:
    """A worker on Redis and a client in front of it."""

    def __init__(self, engine: LLMEngine, redis_url: str) -> None:
        self.prefix = f"bench-{uuid.uuid4().hex[:8]}"
        self.stop = asyncio.Event()
        self.task = asyncio.create_task(run_worker(engine, WorkerOptions(redis_url, self.prefix, name="bench"),
                                                   self.stop))
        self.redis = aioredis.from_url(redis_url)
        self.client = AqueductClient(redis_url, self.prefix)

    async def single(self, request: WireRequest) -> float:
        """Seconds to the first reply entry; returns once the request has finished."""
        started = time.perf_counter()
        await self.client.submit(request)
        while not await self.redis.xread({f"{self.prefix}:out:{request.id}": "0"}, block=1000, count=1):
            pass
        first = time.perf_counter() - started
        await self.client.result(request.id)
        return first

    async def throughput(self, requests: list[WireRequest]) -> float:
        reply_to = f"{self.prefix}:out:load"
        started = time.perf_counter()
        await self.client.submit_many([msgspec.structs.replace(request, reply_to=reply_to) for request in requests])
        remaining, last_id = len(requests), "0"
        while remaining:
            for _, entries in await self.redis.xread({reply_to: last_id}, block=1000, count=1000) or []:
                for entry_id, fields in entries:
                    last_id = entry_id
                    reply = decode_reply(fields[DATA_FIELD])
                    remaining -= reply.usage is not None or reply.error is not None
        return time.perf_counter() - started

    async def close(self) -> None:
        self.stop.set()
        await self.task
        await self.client.close()
        keys = [key async for key in self.redis.scan_iter(f"{self.prefix}:*")]
        if keys:
            await self.redis.delete(*keys)
        await self.redis.aclose()


async def _compare(args: argparse.Namespace, engines: tuple[LLMEngine, LLMEngine]) -> dict:
    vocab = engines[0].vocab_size
    small = make_workload(args.num_ttft, (16, 64), (2, 2), vocab, seed=3)
    load = make_workload(args.num_requests, tuple(args.prompt_len), tuple(args.output_len), vocab, seed=0)
    paths = {"memory": MemoryPath(engines[0]), "redis": RedisPath(engines[1], args.redis_url)}
    await asyncio.sleep(0.5)  # the worker creates its group and starts reading
    try:
        for label, path in paths.items():  # warm-up
            for request in _requests(make_workload(3, (8, 16), (2, 2), vocab, seed=9), f"warm-{label}"):
                await path.single(request)
        ttfts: dict[str, list[float]] = {"memory": [], "redis": []}
        for request in _requests(small, "ttft"):
            for label, path in paths.items():  # alternate, so drift hits both paths alike
                ttfts[label].append(await path.single(msgspec.structs.replace(request, id=f"{request.id}-{label}")))
        seconds = {label: await path.throughput(_requests(load, f"load-{label}")) for label, path in paths.items()}
    finally:
        for path in paths.values():
            await path.close()
    return {"ttfts": ttfts, "seconds": seconds, "tokens": load.useful_tokens}


def _ms(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q * 100) - 1] * 1000 if len(values) > 1 else values[0] * 1000


def run_bench_redis(args: argparse.Namespace) -> None:
    config = engine_config_from_args(args)
    results = event_loop.run(_compare(args, (LLMEngine(config), LLMEngine(config))))
    ttfts, seconds, tokens = results["ttfts"], results["seconds"], results["tokens"]
    print(f"time to first token, {args.num_ttft} single requests one at a time, alternating paths "
          f"(prompt 16-64 tokens):")
    for label, values in ttfts.items():
        print(f"  {label:6s} p50 {_ms(values, 0.5):7.2f} ms   p90 {_ms(values, 0.9):7.2f} ms")
    print(f"  added by Redis: p50 {_ms(ttfts['redis'], 0.5) - _ms(ttfts['memory'], 0.5):+.2f} ms")
    print(f"throughput, {args.num_requests} requests, prompt {args.prompt_len[0]}-{args.prompt_len[1]}, "
          f"output {args.output_len[0]}-{args.output_len[1]} ({tokens} tokens):")
    print(f"  embedded graph (aqueduct batch) {tokens / seconds['memory']:8.1f} tokens/s")
    print(f"  worker via Redis               {tokens / seconds['redis']:8.1f} tokens/s")
    print(f"  ratio worker / batch: {seconds['memory'] / seconds['redis']:.2f}x")
