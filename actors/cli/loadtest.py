"""`aqueduct loadtest`: push requests at a fixed rate to a deployment and account for every one.

All requests reply on one shared stream read by one reader. Reports completed, errors, lost
(submitted but never finished: must be 0), duplicated (a seq seen twice for a request), and
p50/p99 time to first token and end-to-end latency; also how many requests the workers held at
once (bounded by their admission control) and how many waited in Redis.

`--hostile-fraction F` makes that share of the entries hostile (actors/cli/hostile_entries.py):
the good requests are reported apart, so their latency can be set beside a clean run's; every
hostile entry must be answered (an error reply, or a normal one when it is valid after all), and
no worker may go away (`{prefix}:worker:*` heartbeats, watched while submitting).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time
import uuid
from dataclasses import dataclass, field

import redis.asyncio as aioredis

from actors.cli.bench import make_workload
from actors.cli.hostile_entries import HOSTILE_KINDS
from actors.kit import event_loop
from actors.worker.recovery.liveness import heartbeat_key
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
    hostile: str | None = None  # the kind of hostile entry, None for a good request


async def _produce(redis: aioredis.Redis, args: argparse.Namespace, run_id: str, reply_to: str,
                   tracked: dict[str, _Tracked], depth: list[tuple[int, int]], workers: list[set[str]]) -> None:
    workload = make_workload(int(args.rate * args.duration) + 1, tuple(args.prompt_len), tuple(args.output_len),
                             args.vocab_size, seed=0)
    hostile_draw = random.Random(1)
    started = time.perf_counter()
    for index, (prompt, output_len) in enumerate(zip(workload.prompts, workload.output_lens, strict=True)):
        due = started + index / args.rate
        if due > started + args.duration:
            break
        await asyncio.sleep(max(0.0, due - time.perf_counter()))
        request_id = f"{run_id}-{index}"
        if hostile_draw.random() < args.hostile_fraction:
            kind, build = HOSTILE_KINDS[index % len(HOSTILE_KINDS)]
            raw = build(request_id, reply_to)
        else:
            kind, raw = None, encode(WireRequest(
                id=request_id, prompt_token_ids=prompt, reply_to=reply_to,
                params={"max_tokens": output_len, "temperature": 0.0, "ignore_eos": True}))
        tracked[request_id] = _Tracked(time.perf_counter(), hostile=kind)
        await redis.xadd(f"{args.prefix}:requests", {DATA_FIELD: raw})
        if index % 20 == 0:
            depth.append(await _group_state(redis, f"{args.prefix}:requests"))
            workers.append(await _live_workers(redis, args.prefix))


async def _live_workers(redis: aioredis.Redis, prefix: str) -> set[str]:
    pattern_start = len(heartbeat_key(prefix, ""))
    return {key.decode()[pattern_start:] async for key in redis.scan_iter(match=heartbeat_key(prefix, "*"))}


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
    workers = [await _live_workers(redis, args.prefix)]
    done = asyncio.Event()
    reader = asyncio.create_task(_consume(redis, reply_to, tracked, done))
    await _produce(redis, args, run_id, reply_to, tracked, depth, workers)
    deadline = time.perf_counter() + args.wait
    while time.perf_counter() < deadline and any(t.final_s is None for t in tracked.values()):
        await asyncio.sleep(0.2)
    done.set()
    await reader
    workers.append(await _live_workers(redis, args.prefix))
    await redis.delete(reply_to)
    await redis.aclose()
    return {"tracked": tracked, "depth": depth, "workers": workers}


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
    good = [t for t in tracked.values() if t.hostile is None]
    completed = [t for t in good if t.final_s is not None and not t.error]
    errors = sum(1 for t in good if t.error)
    lost = sum(1 for t in good if t.final_s is None)
    duplicated = sum(t.duplicates for t in tracked.values())
    ttft = [t.first_s - t.submitted_s for t in completed if t.first_s is not None]
    e2e = [t.final_s - t.submitted_s for t in completed]
    print(f"submitted {len(tracked)} at {args.rate}/s for {args.duration} s; good {len(good)}: completed "
          f"{len(completed)}, errors {errors}, lost {lost}; duplicated entries {duplicated}")
    print(f"good requests: time to first token {_percentiles(ttft)}; end to end {_percentiles(e2e)}")
    held = max((pending for pending, _ in result["depth"]), default=0)
    waiting = max((lag for _, lag in result["depth"]), default=0)
    print(f"while submitting: at most {held} requests held by workers, {waiting} waiting in Redis")
    unanswered = _report_hostile([t for t in tracked.values() if t.hostile is not None])
    gone = _report_workers(result["workers"])
    return 1 if lost or unanswered or gone else 0


def _report_hostile(hostile: list[_Tracked]) -> int:
    """Prints how the hostile entries were answered; returns how many were not (must be 0)."""
    if not hostile:
        return 0
    refused = sum(1 for t in hostile if t.error)
    unanswered = sorted({t.hostile or "" for t in hostile if t.final_s is None})
    count = sum(1 for t in hostile if t.final_s is None)
    print(f"hostile {len(hostile)}: answered with an error {refused}, generated {len(hostile) - refused - count}, "
          f"unanswered {count}" + (f" ({', '.join(unanswered)})" if unanswered else ""))
    return count


def _report_workers(samples: list[set[str]]) -> int:
    """Prints the workers seen alive; returns how many of those alive at the start went away."""
    at_start, at_end = samples[0], samples[-1]
    gone = at_start - at_end
    seen = set().union(*samples)
    print(f"workers alive: {len(at_start)} at the start, {len(at_end)} at the end, {len(seen)} seen"
          + (f"; gone: {', '.join(sorted(gone))}" if gone else ""))
    return len(gone)
