"""Prefix-affinity placement, the entry side: offer a request to the worker that caches the longest
prefix of its prompt (docs/design.md §3, "Placement").

Workers pull, so placement cannot push a request into one. Instead each worker has an affinity
stream per priority lane, `{lane}:at:{worker}`, which it reads before the shared lane; where a
request enters (gateway, batch runner, wire client) it looks up the directory the workers publish
and XADDs to the chosen worker's affinity stream (the shared lane when no worker takes offers, or
when the request's blocks cannot be named there). A worker that does not take an offer within the
placement wait loses it to any worker with room (queue_adapters/stealing.py), so a busy worker
never holds up a request.

The directory, per worker (each expiring with the worker's heartbeat when not refreshed):
    {prefix}:placement:workers          set of worker names that take offers
    {prefix}:placement:blocks:{worker}  set of the placement keys of its cached blocks
    {prefix}:placement:room:{worker}    how many more requests it would admit now

The choice (best_candidate): among live workers with room (all when none has room), the one caching
the longest run of the request's leading blocks; but the least busy one when no worker caches any
of them (a miss) or when the holder is busier than the least busy by more than a quarter of its
capacity (at least 4 requests): a conversation's turns follow its cache, not into a queue. Room is
what the worker last published less the offers this entry point made since, so a burst of requests
deciding at once spreads over the workers instead of all landing on the one that looked emptiest.
"""

from __future__ import annotations

import random
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass

import redis.asyncio as aioredis

from pipeline.scheduling.prefix_keys import prefix_keys
from queue_adapters.codec import WireRequest
from queue_adapters.priority_lanes import LANES, lane_key, lane_of

WORKER_LIST_TTL_S = 1.0  # how long an entry point reuses the worker list before reading it again
RECENT_OFFER_S = 0.2  # an offer counts against its worker's published room this long (it publishes every 50 ms)

# KEYS: the worker's heartbeat, its affinity stream, the shared lane; ARGV: the entry's data.
# Atomic, so an offer never lands on the stream of a worker already gone (its streams may be retired).
_OFFER = """
if redis.call('EXISTS', KEYS[1]) == 1 then
  return {1, redis.call('XADD', KEYS[2], '*', 'data', ARGV[1])}
end
return {0, redis.call('XADD', KEYS[3], '*', 'data', ARGV[1])}
"""


def workers_key(prefix: str) -> str:
    return f"{prefix}:placement:workers"


def blocks_key(prefix: str, worker: str) -> str:
    return f"{prefix}:placement:blocks:{worker}"


def room_key(prefix: str, worker: str) -> str:
    return f"{prefix}:placement:room:{worker}"


def affinity_key(prefix: str, lane: str, worker: str) -> str:
    """Worker `worker`'s offers on `lane`, e.g. aqueduct:requests:at:w1, aqueduct:requests:bulk:at:w1."""
    return f"{lane_key(prefix, lane)}:at:{worker}"


def affinity_keys(prefix: str, worker: str) -> list[str]:
    return [affinity_key(prefix, lane, worker) for lane in LANES]


@dataclass(frozen=True, slots=True)
class Candidate:
    worker: str
    cached_blocks: int  # leading placement keys of the request found in its directory
    room: int  # requests it would admit now, less the offers made to it since it last said
    capacity: int  # its --max-in-flight

    @property
    def load(self) -> int:
        return self.capacity - self.room


HIT, MISS, BALANCED = "hit", "miss", "balanced"  # why a worker was chosen
SHARED_LANE = "shared"  # no worker was: none takes offers, or the one chosen was gone by the offer


def leading_hits(found: list[int | bool]) -> int:
    """Leading members found: [1, 1, 0, 1] -> 2 (the chain is broken at the third block)."""
    count = 0
    for hit in found:
        if not hit:
            break
        count += 1
    return count


def balance_slack(capacity: int) -> int:
    """How much busier than the least busy worker a prefix holder may be and still get the request:
    a quarter of its capacity, at least 4 requests."""
    return max(4, capacity // 4)


def best_candidate(candidates: list[Candidate], rng: random.Random | None = None) -> tuple[Candidate, str] | None:
    """(the worker to offer to, why): the one caching the longest prefix among those with room (all,
    when none has room) -- unless it is busier than the least busy by more than the balance slack,
    or no worker caches any of it: then the least busy (a random one of the equally least busy, so
    that entry points deciding at once spread their offers)."""
    with_room = [candidate for candidate in candidates if candidate.room > 0] or candidates
    if not with_room:
        return None
    rng = rng or random
    most_room = max(candidate.room for candidate in with_room)
    least_busy = rng.choice([candidate for candidate in with_room if candidate.room == most_room])
    best = max(with_room, key=lambda candidate: (candidate.cached_blocks, candidate.room))
    if best.cached_blocks == 0:
        return least_busy, MISS
    if best.load > least_busy.load + balance_slack(best.capacity):
        return least_busy, BALANCED
    return best, HIT


class PrefixDirectory:
    """What an entry point needs: the workers' published prefixes, and offers onto their streams."""

    def __init__(self, redis: aioredis.Redis, prefix: str, heartbeat_prefix: str | None = None) -> None:
        self.redis = redis
        self.prefix = prefix
        self.heartbeat_prefix = heartbeat_prefix or f"{prefix}:worker"
        self._offer = redis.register_script(_OFFER)
        self._workers: list[str] = []
        self._workers_read_at = float("-inf")
        self._recent: dict[str, deque[float]] = {}  # worker -> when this entry point offered to it lately

    async def choose(self, keys: list[bytes]) -> tuple[Candidate, str] | None:
        """The live worker to offer a prompt with these placement keys to, and why; None: no worker
        takes offers (the shared lane)."""
        workers = await self._worker_names()
        if not workers:
            return None
        async with self.redis.pipeline(transaction=False) as pipe:
            for worker in workers:
                pipe.get(f"{self.heartbeat_prefix}:{worker}")
                pipe.get(room_key(self.prefix, worker))
                pipe.smismember(blocks_key(self.prefix, worker), keys) if keys else pipe.echo(b"")
            results = await pipe.execute()
        candidates = [Candidate(worker, leading_hits(found) if keys else 0,
                                int(room or 0) - self._recent_offers(worker), _int(capacity))
                      for worker, (capacity, room, found) in zip(workers, _triples(results), strict=True)
                      if capacity is not None]
        return best_candidate(candidates)

    def _recent_offers(self, worker: str) -> int:
        """Offers made here within the directory's refresh: the published room does not count them yet."""
        times = self._recent.get(worker)
        horizon = time.monotonic() - RECENT_OFFER_S
        while times and times[0] < horizon:
            times.popleft()
        return len(times) if times else 0

    async def offer(self, raw: bytes, priority: int, worker: str | None) -> tuple[str, str]:
        """XADD the entry to `worker`'s affinity stream of its lane (the shared lane when `worker`
        is None or no longer alive); (the stream it went to, the entry id)."""
        lane = lane_of(priority)
        shared = lane_key(self.prefix, lane)
        if worker is None:
            entry_id = await self.redis.xadd(shared, {b"data": raw})
            return shared, _text(entry_id)
        offered, entry_id = await self._offer(
            keys=[f"{self.heartbeat_prefix}:{worker}", affinity_key(self.prefix, lane, worker), shared], args=[raw])
        if offered:
            self._recent.setdefault(worker, deque()).append(time.monotonic())
        return (affinity_key(self.prefix, lane, worker) if offered else shared), _text(entry_id)

    async def _worker_names(self) -> list[str]:
        now = time.monotonic()
        if now - self._workers_read_at > WORKER_LIST_TTL_S or not self._workers:  # none yet: look again
            self._workers = sorted(_text(name) for name in await self.redis.smembers(workers_key(self.prefix)))
            self._workers_read_at = now
        return self._workers


PromptRenderer = Callable[[WireRequest], list[int]]  # text or messages -> the ids a worker will compute


class Placement:
    """An entry point's placement: names a request's prompt blocks as the workers will, and offers
    it to the worker caching most of them (or the shared lane)."""

    def __init__(self, directory: PrefixDirectory, block_size: int, render: PromptRenderer | None = None) -> None:
        self.directory = directory
        self.block_size = block_size
        self.render = render  # None: only prompt_token_ids requests are placed (no tokenizer here)
        self.outcomes: Counter[str] = Counter()  # HIT, MISS, BALANCED, SHARED_LANE: where requests went, why

    def keys_of(self, request: WireRequest) -> list[bytes]:
        """The request's placement keys; [] when they cannot be known here (images, an embedding, no
        tokenizer for its text) or the prompt fills no block. A prompt that fails to render is left to
        the worker, which answers it with the error."""
        if request.images or request.embed:
            return []
        ids: list[int] | None = request.prompt_token_ids
        if ids is None and self.render is not None:
            try:
                ids = self.render(request)
            except ValueError:
                return []
        if not ids:
            return []
        keep = request.params.get("truncate_prompt_tokens")
        if isinstance(keep, int) and not isinstance(keep, bool) and keep > 0:
            ids = ids[-keep:]  # as the worker cuts it
        return prefix_keys(ids, self.block_size, request.lora)

    async def submit(self, raw: bytes, request: WireRequest, keys: list[bytes]) -> str:
        """Offer the encoded request by its keys; the stream it went to."""
        chosen = await self.directory.choose(keys)
        stream, _ = await self.directory.offer(raw, request.priority, chosen[0].worker if chosen else None)
        self.outcomes[chosen[1] if chosen and ":at:" in stream else SHARED_LANE] += 1
        return stream


def _triples(results: list) -> list[tuple]:
    return [tuple(results[index:index + 3]) for index in range(0, len(results), 3)]


def _int(value: bytes | str) -> int:
    try:
        return max(1, int(value))
    except ValueError:
        return 1


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
