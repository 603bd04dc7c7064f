"""The worker's actor graph against the plain step loop, side by side in one process.

    python benchmarks/graph_vs_loop.py --model builtin -n 128 --prompt-len 16 256 --output-len 16 256
    python benchmarks/graph_vs_loop.py --model smollm2 -n 32 --prompt-len 16 256 --output-len 16 128
    python benchmarks/graph_vs_loop.py --model smollm2 -n 1 --prompt-len 16 16 --output-len 128 128

One engine, built on its device thread, serves the same workload three ways in turn:
- loop:   `aqueduct batch` (LLMEngine.step on the device thread, replies encoded and dropped)
- memory: `aqueduct batch --actor-graph` (the actor graph over memory streams, replies to a memory sink)
- redis:  `aqueduct worker` (the graph behind a Redis consumer group; a client in a process of its
          own submits every request in one pipeline, as the other paths get them all at once, and
          reads all replies from one shared reply stream)
Each round runs the three in a rotating order, so a drift of the (shared, noisy) machine hits them
alike. Prompts have the same lengths on every path but a different first token, so no path gets
another's prefix-cache hits. Greedy, ignore_eos: every request generates exactly its output length.
"""

from __future__ import annotations

from actors.kit import event_loop
from actors.kit.process_tuning import passive_omp_wait

passive_omp_wait()  # as the `aqueduct` CLI does, before anything loads torch and its OpenMP runtime

import argparse
import asyncio
import multiprocessing
import statistics
import time
import uuid
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

import msgspec
import redis.asyncio as aioredis
from tqdm import tqdm

from actors.cli.batch import run_embedded, run_offline
from actors.cli.bench import Workload, make_workload
from actors.cli.engine_args import add_engine_args, engine_config_from_args
from actors.cli.logging_setup import configure_logging
from actors.kit.device import device_thread, load_engine
from actors.kit.process_tuning import set_compute_threads, startup_collector_paused, tune_glibc_malloc
from actors.worker.run import WorkerOptions, run_worker
from pipeline.engine import LLMEngine
from queue_adapters.client import AqueductClient
from queue_adapters.codec import WireRequest, decode_reply
from queue_adapters.redis_streams import DATA_FIELD

PATHS = ("loop", "memory", "redis")


def requests_for(workload: Workload, path: str, tag: str, vocab_size: int) -> list[WireRequest]:
    first_token = 1 + PATHS.index(path)  # differs per path: no prefix-cache hits across paths
    return [WireRequest(id=f"{tag}-{path}-{i}", prompt_token_ids=[first_token, *prompt[1:]],
                        params={"max_tokens": output_len, "temperature": 0.0, "ignore_eos": True})
            for i, (prompt, output_len) in enumerate(zip(workload.prompts, workload.output_lens, strict=True))
            if first_token < vocab_size]


def run_loop(engine: LLMEngine, device: ThreadPoolExecutor, requests: list[WireRequest]) -> float:
    started = time.perf_counter()
    device.submit(run_offline, engine, requests, tqdm(disable=True)).result()
    return time.perf_counter() - started


def run_memory(engine: LLMEngine, device: ThreadPoolExecutor, requests: list[WireRequest]) -> float:
    started = time.perf_counter()
    event_loop.run(run_embedded(engine, requests, tqdm(disable=True), device))
    return time.perf_counter() - started


async def _submit_and_read(redis_url: str, prefix: str, requests: list[WireRequest]) -> float:
    """The client's side: submit every request, read every reply; seconds from the first submit to
    the last final reply."""
    redis = aioredis.from_url(redis_url)
    client = AqueductClient(redis_url, prefix)
    reply_to = f"{prefix}:out:all"
    try:
        started = time.perf_counter()
        await client.submit_many([msgspec.structs.replace(request, reply_to=reply_to) for request in requests])
        remaining, last_id = len(requests), "0"
        while remaining:
            for _, entries in await redis.xread({reply_to: last_id}, block=1000, count=1000) or []:
                for entry_id, fields in entries:
                    last_id = entry_id
                    reply = decode_reply(fields[DATA_FIELD])
                    remaining -= reply.usage is not None or reply.error is not None
        return time.perf_counter() - started
    finally:
        await client.close()
        await redis.aclose()


def client_round(redis_url: str, prefix: str, requests: list[WireRequest]) -> float:
    """In the client process (as a real client is: its own process, not the worker's event loop)."""
    return asyncio.run(_submit_and_read(redis_url, prefix, requests))


async def _redis_round(engine: LLMEngine, device: ThreadPoolExecutor, requests: list[WireRequest],
                       redis_url: str, clients: ProcessPoolExecutor) -> float:
    prefix = f"graphbench-{uuid.uuid4().hex[:8]}"
    stop = asyncio.Event()
    worker = asyncio.create_task(run_worker(engine, WorkerOptions(redis_url, prefix, name="bench"), stop, device))
    redis = aioredis.from_url(redis_url)
    try:
        await asyncio.sleep(0.3)  # the worker creates its group and starts reading
        client = asyncio.wrap_future(clients.submit(client_round, redis_url, prefix, requests))
        done, _ = await asyncio.wait([client, worker], return_when=asyncio.FIRST_COMPLETED)
        if client not in done:
            raise RuntimeError("the worker stopped before the workload finished")
        return client.result()
    finally:
        stop.set()
        await worker
        keys = [key async for key in redis.scan_iter(f"{prefix}:*")]
        if keys:
            await redis.delete(*keys)
        await redis.aclose()


def run_redis(engine: LLMEngine, device: ThreadPoolExecutor, requests: list[WireRequest], redis_url: str,
              clients: ProcessPoolExecutor) -> float:
    return event_loop.run(_redis_round(engine, device, requests, redis_url, clients))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", "--num-requests", type=int, default=128)
    parser.add_argument("--prompt-len", type=int, nargs=2, default=[16, 256], metavar=("MIN", "MAX"))
    parser.add_argument("--output-len", type=int, nargs=2, default=[16, 256], metavar=("MIN", "MAX"))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379")
    parser.add_argument("--skip-redis", action="store_true")
    add_engine_args(parser)
    args = parser.parse_args()
    configure_logging("WARNING")
    tune_glibc_malloc()  # as the CLI does
    set_compute_threads(args.cpu_threads)
    device = device_thread()
    with startup_collector_paused():  # as the CLI does: the model and modules frozen out of the collector
        engine = load_engine(engine_config_from_args(args), device)
    vocab = engine.vocab_size
    workload = make_workload(args.num_requests, tuple(args.prompt_len), tuple(args.output_len), vocab, seed=0)
    paths = [path for path in PATHS if not (args.skip_redis and path == "redis")]
    # The Redis path's client: one process, started (and warm) before any round.
    clients = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
    clients.submit(time.perf_counter).result()
    runners = {"loop": lambda r: run_loop(engine, device, r), "memory": lambda r: run_memory(engine, device, r),
               "redis": lambda r: run_redis(engine, device, r, args.redis_url, clients)}
    warm = make_workload(4, (8, 16), (4, 8), vocab, seed=1)
    for path in paths:
        runners[path](requests_for(warm, path, "warm", vocab))
    seconds: dict[str, list[float]] = {path: [] for path in paths}
    for round_index in range(args.rounds):
        order = paths[round_index % len(paths):] + paths[:round_index % len(paths)]
        for path in order:
            seconds[path].append(runners[path](requests_for(workload, path, f"r{round_index}", vocab)))
            print(f"round {round_index} {path}: {workload.useful_tokens / seconds[path][-1]:.1f} tokens/s", flush=True)
    tokens = workload.useful_tokens
    print(f"model {engine.model_name}: {args.num_requests} requests, prompt {args.prompt_len[0]}-{args.prompt_len[1]}, "
          f"output {args.output_len[0]}-{args.output_len[1]} ({tokens} tokens), {args.rounds} rounds")
    rates = {path: [tokens / s for s in values] for path, values in seconds.items()}
    for path in paths:
        print(f"  {path:7s} " + "  ".join(f"{rate:8.1f}" for rate in rates[path]) + "  tokens/s"
              f"   (median {statistics.median(rates[path]):.1f})")
    for path in paths[1:]:
        ratios = [rate / loop for rate, loop in zip(rates[path], rates["loop"], strict=True)]
        print(f"  {path} / loop: " + "  ".join(f"{ratio:.2f}x" for ratio in ratios))
    if "redis" in paths:
        ratios = [rate / memory for rate, memory in zip(rates["redis"], rates["memory"], strict=True)]
        print("  redis / memory: " + "  ".join(f"{ratio:.2f}x" for ratio in ratios))
    clients.shutdown()


if __name__ == "__main__":
    main()
