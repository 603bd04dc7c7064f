"""`aqueduct loadtest`: push requests at a fixed rate to a deployment and account for every one.

All requests reply on one shared stream read by one reader. Reports completed, errors, lost
(submitted but never finished: must be 0), duplicated (a seq seen twice for a request), and
p50/p99 time to first token and end-to-end latency; also how many requests the workers held at
once (bounded by their admission control) and how many waited in Redis.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid
from dataclasses import dataclass, field

import redis.asyncio as aioredis

from actors import event_loop
from actors.frontends.bench import make_workload
from queue_adapters.codec import WireRequest, decode_reply, encode
from queue_adapters.redis_streams import DATA_FIELD


@dataclass(slots=True)
class _Tracked:
    submitted_s: float
    first_s: float | None = None
    final_s: float | None = None
    error: bool = False
    seqs: set[int] = field(default_factory=set)
    duplicates: int = 0


async def _produce(redis: aioredis.Redis, args: argparse.Namespace, run_id: str, reply_to: str,
                   tracked: dict[str, _Tracked], depth: list[tuple[int, int]]) -> None:
    workload = make_workload(int(args.rate * args.duration) + 1, tuple(args.prompt_len), tuple(args.output_len),
                             args.vocab_size, seed=0)
    started = time.perf_counter()
    for index, (prompt, output_len) in enumerate(zip(workload.prompts, workload.output_lens, strict=True)):
        due = started + index / args.rate
        if due > started + args.duration:
            break
        await asyncio.sleep(max(0.0, due - time.perf_counter()))
        request = WireRequest(id=f"{run_id}-{index}", prompt_token_ids=prompt, reply_to=reply_to,
                              params={"max_tokens": output_len, "temperature": 0.0, "ignore_eos": True})
        tracked[request.id] = _Tracked(time.perf_counter())
        await redis.xadd(f"{args.prefix}:requests", {DATA_FIELD: encode(request)})
        if index % 20 == 0:
            depth.append(await _group_state(redis, f"{args.prefix}:requests"))


async def _group_state(redis: aioredis.Redis, stream: str) -> tuple[int, int]:
    """(held by workers = pending, waiting in Redis = lag) of the workers' consumer group."""
    for group in await redis.xinfo_groups(stream):
        if group["name"] in (b"workers", "workers"):
            return int(group["pending"]), int(group.get("lag") or 0)
    return 0, 0


async def _consume(redis: aioredis.Redis, reply_to: str, tracked: dict[str, _Tracked], done: asyncio.Event) -> None:
    last_id = "0"
    while not done.is_set():
        for _, entries in await redis.xread({reply_to: last_id}, block=200, count=1000) or []:
            now = time.perf_counter()
            for entry_id, fields in entries:
                last_id = entry_id
                reply = decode_reply(fields[DATA_FIELD])
                state = tracked.get(reply.id)
                if state is None:
                    continue
                if reply.seq in state.seqs:
                    state.duplicates += 1
                    continue
                state.seqs.add(reply.seq)
                if state.first_s is None and any(choice.token_ids for choice in reply.choices):
                    state.first_s = now
                if reply.usage is not None or reply.error is not None:
                    state.final_s, state.error = now, reply.error is not None


async def _run(args: argparse.Namespace) -> dict[str, object]:
    redis = aioredis.from_url(args.redis_url)
    run_id = f"load-{uuid.uuid4().hex[:8]}"
    reply_to = f"{args.prefix}:out:{run_id}"
    tracked: dict[str, _Tracked] = {}
    depth: list[tuple[int, int]] = []
    done = asyncio.Event()
    reader = asyncio.create_task(_consume(redis, reply_to, tracked, done))
    await _produce(redis, args, run_id, reply_to, tracked, depth)
    deadline = time.perf_counter() + args.wait
    while time.perf_counter() < deadline and any(t.final_s is None for t in tracked.values()):
        await asyncio.sleep(0.2)
    done.set()
    await reader
    await redis.delete(reply_to)
    await redis.aclose()
    return {"tracked": tracked, "depth": depth}


def _percentiles(values: list[float]) -> str:
    if not values:
        return "n/a"
    if len(values) == 1:
        return f"p50 {values[0] * 1000:.0f} ms"
    cuts = statistics.quantiles(values, n=100)
    return f"p50 {cuts[49] * 1000:.0f} ms, p99 {cuts[98] * 1000:.0f} ms"


def run_loadtest(args: argparse.Namespace) -> int:
    result = event_loop.run(_run(args))
    tracked: dict[str, _Tracked] = result["tracked"]
    completed = [t for t in tracked.values() if t.final_s is not None and not t.error]
    errors = sum(1 for t in tracked.values() if t.error)
    lost = sum(1 for t in tracked.values() if t.final_s is None)
    duplicated = sum(t.duplicates for t in tracked.values())
    ttft = [t.first_s - t.submitted_s for t in completed if t.first_s is not None]
    e2e = [t.final_s - t.submitted_s for t in completed]
    print(f"submitted {len(tracked)} at {args.rate}/s for {args.duration} s; completed {len(completed)}, "
          f"errors {errors}, lost {lost}, duplicated entries {duplicated}")
    print(f"time to first token {_percentiles(ttft)}; end to end {_percentiles(e2e)}")
    held = max((pending for pending, _ in result["depth"]), default=0)
    waiting = max((lag for _, lag in result["depth"]), default=0)
    print(f"while submitting: at most {held} requests held by workers, {waiting} waiting in Redis")
    return 1 if lost else 0
