"""Multi-turn chat over a fleet: the prefix-cache hit rate and wall time with prefix placement,
against `--placement any` and against one worker that sees every turn (the ideal hit rate).

    python benchmarks/placement.py --workers 3 --conversations 12 --turns 4 --in-flight 8

Each conversation has its own system prompt (~600 tokens of random words) and re-sends its whole
history every turn (chat messages, rendered by the chat template), so a turn's prompt starts with
everything the previous turn's prompt and answer held. Turns of one conversation run in order;
`--in-flight` turns of different conversations run at once. Requests go over the wire through
AqueductClient, placed as the gateway places them (the chat template and tokenizer of the served
model name each prompt's blocks). Workers are `aqueduct worker` processes on the default model
(SmolLM2-135M unless --model), restarted for each setting on a fresh Redis prefix, each with
cores / workers threads. Printed: cached prompt tokens as a share of the one-worker run's, wall
time, and where the workers took requests from (offered, stolen, shared). Figures depend on the
machine and what else runs on it: compare the ratios of one run.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass

import redis.asyncio as aioredis
from worker_fleet import stop_and_clear, wait_ready

from actors.http.backends import prompt_renderer
from actors.kit.device import load_model_tokenizer
from pipeline.config import ModelConfig
from pipeline.loading.model_source import default_cli_model
from queue_adapters.client import AqueductClient
from queue_adapters.codec import WireRequest
from queue_adapters.placement import Placement, PrefixDirectory

WORDS = [
    "river",
    "stone",
    "light",
    "garden",
    "window",
    "paper",
    "music",
    "orange",
    "silver",
    "cloud",
    "market",
    "engine",
    "forest",
    "letter",
    "winter",
    "summer",
    "harbor",
    "candle",
    "mirror",
    "bridge",
    "valley",
    "planet",
    "signal",
    "button",
    "pocket",
    "thunder",
    "meadow",
]


@dataclass
class Outcome:
    cached_tokens: int
    prompt_tokens: int
    wall_s: float
    sources: list[dict[str, int]]  # per worker
    outcomes: dict[str, int]  # the entry point's choices


def _start_workers(args: argparse.Namespace, prefix: str, count: int, placement: str) -> list[subprocess.Popen]:
    model = ["--model", args.model] if args.model else []
    threads = max(1, (os.cpu_count() or 1) // count)
    command = [
        sys.executable,
        "-m",
        "actors.cli",
        "worker",
        *model,
        "--redis-url",
        args.redis_url,
        "--prefix",
        prefix,
        "--placement",
        placement,
        "--log-level",
        "WARNING",
        "--cpu-threads",
        str(threads),
        "--health-host",
        "127.0.0.1",
    ]
    return [
        subprocess.Popen([*command, "--name", f"bench-{index}", "--health-port", str(args.health_port + index)])
        for index in range(count)
    ]


def _conversations(args: argparse.Namespace) -> list[list[dict]]:
    rng = random.Random(args.seed)
    return [
        [{"role": "system", "content": " ".join(rng.choice(WORDS) for _ in range(args.system_words))}]
        for _ in range(args.conversations)
    ]


async def _run_conversation(
    client: AqueductClient,
    messages: list[dict],
    turns: int,
    max_tokens: int,
    slots: asyncio.Semaphore,
    rng: random.Random,
) -> tuple[int, int]:
    cached = prompt = 0
    for turn in range(turns):
        messages.append({"role": "user", "content": f"Turn {turn}: " + " ".join(rng.choice(WORDS) for _ in range(20))})
        async with slots:
            request_id = await client.submit(
                WireRequest(
                    id=f"chat-{uuid.uuid4().hex[:10]}",
                    messages=messages,
                    params={"max_tokens": max_tokens, "temperature": 0, "ignore_eos": True},
                )
            )
            result = await client.result(request_id, timeout_s=600)
        cached += result["usage"]["cached_tokens"]
        prompt += result["usage"]["prompt_tokens"]
        messages.append({"role": "assistant", "content": result["choices"][0]["text"]})
    return cached, prompt


async def _scrape_sources(args: argparse.Namespace, count: int) -> list[dict[str, int]]:
    """aqueduct_placement_requests_total by source, per worker (from each worker's /metrics)."""
    import httpx

    per_worker = []
    async with httpx.AsyncClient() as http:
        for index in range(count):
            text = (await http.get(f"http://127.0.0.1:{args.health_port + index}/metrics")).text
            sources = {}
            for line in text.splitlines():
                if line.startswith("aqueduct_placement_requests_total{"):
                    source = line.split('source="')[1].split('"')[0]
                    sources[source] = int(float(line.rsplit(" ", 1)[1]))
            per_worker.append(sources)
    return per_worker


async def _setting(args: argparse.Namespace, count: int, placement: str, render) -> Outcome:
    prefix = f"bench-placement:{uuid.uuid4().hex[:8]}"
    redis = aioredis.Redis.from_url(args.redis_url)
    workers = _start_workers(args, prefix, count, placement)
    try:
        await wait_ready(redis, prefix, count)
        placer = Placement(PrefixDirectory(redis, prefix), args.block_size, render) if placement == "prefix" else None
        slots, rng = asyncio.Semaphore(args.in_flight), random.Random(args.seed + 1)
        async with AqueductClient(args.redis_url, prefix, redis=redis, placement=placer) as client:
            started = time.perf_counter()
            results = await asyncio.gather(
                *(
                    _run_conversation(client, messages, args.turns, args.max_tokens, slots, random.Random(rng.random()))
                    for messages in _conversations(args)
                )
            )
            wall_s = time.perf_counter() - started
        sources = await _scrape_sources(args, count)
        outcomes = dict(placer.outcomes) if placer is not None else {}
        return Outcome(sum(c for c, _ in results), sum(p for _, p in results), wall_s, sources, outcomes)
    finally:
        await stop_and_clear(workers, redis, prefix)


async def main(args: argparse.Namespace) -> None:
    tokenizer, name = load_model_tokenizer(ModelConfig(model=args.model or default_cli_model()))
    render = prompt_renderer(tokenizer, None)
    ideal = await _setting(args, 1, "prefix", render)
    print(
        f"model {name}; {args.conversations} conversations x {args.turns} turns, {args.in_flight} in flight, "
        f"{ideal.prompt_tokens} prompt tokens in all"
    )
    print(f"{'setting':<32} {'cached tokens':>14} {'of ideal':>9} {'wall s':>8} {'vs any':>7}")
    rows = [("1 worker (ideal)", ideal)]
    runs: dict[str, list[Outcome]] = {"any": [], "prefix": []}
    for _ in range(args.repeats):  # alternated, so a change in the machine's load hits both alike
        for placement in ("any", "prefix"):
            runs[placement].append(await _setting(args, args.workers, placement, render))
    any_run, prefix_run = (_median(runs[placement]) for placement in ("any", "prefix"))
    rows += [(f"{args.workers} workers, --placement any", any_run),
             (f"{args.workers} workers, --placement prefix", prefix_run)]
    if args.repeats > 1:
        for placement, outcomes in runs.items():
            print(f"--placement {placement} wall times: {', '.join(f'{o.wall_s:.1f}' for o in outcomes)} s")
    for label, outcome in rows:
        share = outcome.cached_tokens / max(1, ideal.cached_tokens)
        print(f"{label:<32} {outcome.cached_tokens:>14} {share:>9.2f} {outcome.wall_s:>8.1f} "
              f"{outcome.wall_s / any_run.wall_s:>7.2f}")
    for label, outcome in rows:
        taken = " | ".join(", ".join(f"{key} {value}" for key, value in sorted(worker.items()) if value)
                           for worker in outcome.sources)
        print(f"{label:<32} taken per worker: {taken}; choices: {outcome.outcomes or '-'}")


def _median(outcomes: list[Outcome]) -> Outcome:
    """The run of median wall time (the lower middle one of an even count)."""
    return sorted(outcomes, key=lambda outcome: outcome.wall_s)[(len(outcomes) - 1) // 2]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379")
    parser.add_argument("--model", default=None, help="default: the built-in default model (SmolLM2-135M)")
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--conversations", type=int, default=12)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--in-flight", type=int, default=8)
    parser.add_argument("--system-words", type=int, default=600, help="words in each system prompt (~1 token each)")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--block-size", type=int, default=16, help="the workers' --block-size")
    parser.add_argument("--health-port", type=int, default=19400, help="first worker's metrics port")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--repeats", type=int, default=1, help="runs of each fleet setting, alternated; the median")
    return parser.parse_args()


if __name__ == "__main__":
    asyncio.run(main(parse_args()))
