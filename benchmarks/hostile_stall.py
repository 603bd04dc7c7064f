"""Whether hostile bodies stall other streams: a good request streams from `aqueduct serve` while five
large hostile bodies are posted at once; prints the good stream's token gaps alone and during the burst.

    python benchmarks/hostile_stall.py --model builtin
    python benchmarks/hostile_stall.py --model builtin --redis-url redis://127.0.0.1:6379   # through a gateway

The bodies (each under the 4 MiB body limit, each refused with a 400): 10,000 DRY sequence breakers,
100,000 stop strings, a 3 MB prompt of many tokens past the context, a logit_bias of 290,000 entries,
custom_token_bans of 4 MB. Gaps are measured by this client, between the good stream's chunks.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import socket
import statistics
import subprocess
import sys
import time

import httpx


def hostile_bodies() -> list[bytes]:
    base = {"max_tokens": 4}
    bodies = [
        {**base, "prompt": "x", "dry_multiplier": 1.0, "dry_sequence_breakers": [f"b{i}" for i in range(10_000)]},
        {**base, "prompt": "x", "stop": [f"stop {i}" for i in range(100_000)]},
        {**base, "prompt": "word " * 600_000},
        {**base, "prompt": "x", "logit_bias": {str(i): 1 for i in range(290_000)}},
        {**base, "prompt": "x", "custom_token_bans": ",".join(str(i % 50_000) for i in range(700_000))},
    ]
    return [json.dumps(body).encode() for body in bodies]


async def good_stream(client: httpx.AsyncClient, arrivals: list[float]) -> None:
    body = {"prompt": "Once upon a time", "max_tokens": None, "ignore_eos": True, "temperature": 0, "stream": True}
    async with client.stream("POST", "/v1/completions", json=body) as stream:
        async for line in stream.aiter_lines():
            if line.startswith("data: {"):
                arrivals.append(time.perf_counter())


def longest_gap(arrivals: list[float], start: float, end: float) -> float:
    """The longest gap between two chunks that overlaps [start, end] (the stream must outlast it)."""
    assert arrivals and arrivals[-1] > end, "the good stream ended before the burst did: use a longer context"
    return max(b - a for a, b in itertools.pairwise(arrivals) if b >= start and a <= end)


async def measure(port: int) -> None:
    bodies = hostile_bodies()
    arrivals: list[float] = []
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=120) as client:
        streaming = asyncio.create_task(good_stream(client, arrivals))
        await asyncio.sleep(1.0)
        burst_start = time.perf_counter()
        responses = await asyncio.gather(*[client.post("/v1/completions", content=body,
                                                       headers={"Content-Type": "application/json"})
                                           for body in bodies])
        burst_end = time.perf_counter()
        await asyncio.sleep(0.2)
        streaming.cancel()
    alone = [b - a for a, b in itertools.pairwise(arrivals) if b < burst_start]
    print(f"hostile statuses: {[response.status_code for response in responses]}, answered in "
          f"{burst_end - burst_start:.2f} s")
    print(f"good stream alone: p50 gap {1000 * statistics.median(alone):.1f} ms, longest {1000 * max(alone):.1f} ms")
    print(f"good stream during the burst: longest gap {1000 * longest_gap(arrivals, burst_start, burst_end):.1f} ms")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="builtin")
    parser.add_argument("--redis-url", default=None, help="serve as a gateway in front of one worker on this Redis")
    args = parser.parse_args()
    port = free_port()
    aqueduct = os.path.join(os.path.dirname(sys.executable), "aqueduct")
    redis = ["--redis-url", args.redis_url, "--prefix", f"bench-stall-{port}"] if args.redis_url else []
    processes = [subprocess.Popen([aqueduct, "serve", "--model", args.model, "--port", str(port), *redis],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    if args.redis_url:
        processes.append(subprocess.Popen([aqueduct, "worker", "--model", args.model, *redis],
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    try:
        for _ in range(600):
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        asyncio.run(measure(port))
    finally:
        for process in processes:
            process.terminate()
            process.wait(30)


if __name__ == "__main__":
    main()
