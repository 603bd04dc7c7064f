"""Fair share across the fleet: each tenant may have at most its weighted share of the fleet's
capacity in flight (queued for or held by workers); a tenant's requests beyond its share wait at
the entry point, not in the request stream ahead of other tenants' (docs/deployment.md#tenants-and-fair-share).

Why at the entry: workers read a lane in arrival order, so 150 requests of one tenant queued ahead
of another's 10 would hold those 10 back however fairly each worker admits what it has read. With
the gate a flooding tenant keeps about its share of the workers' seats filled and the rest of its
flood waits here; another tenant's request finds the lane short and is read as soon as a seat frees.

Share: capacity x weight / (the weights of the tenants with requests in flight, this one's included),
at least 1; capacity is the sum of the live workers' --max-in-flight (unknown, with no worker alive:
no limit, requests queue in Redis as they always did). Example: capacity 64, A (weight 1) holds 64
and B (weight 1) arrives: B's share is 32, so B's request goes straight to the lane; A's share is now
32 too, so A's next requests wait until it holds fewer than 32.

Counting: gateways share per-tenant sets of the ids in flight in Redis (an embedded server counts in
memory), each id with a lease (the request's deadline, else --fair-lease-s) after which it stops
counting, so a gateway that dies mid-request leaks nothing for long.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import redis.asyncio as aioredis

from queue_adapters.codec import WireRequest

DEFAULT_TENANT = "default"  # the tenant of requests that name none
RETRY_S = 0.05  # how often a waiting tenant looks again for seats freed through other gateways

# KEYS: the set of tenants with ids in flight, their weights (hash). ARGV: key prefix of the per-tenant
# sets, tenant, weight, capacity, lease expiry (ms), now (ms), then the ids of one request's prompts.
# 1: entered (all the ids count from now), 0: the tenant holds its share already.
_ENTER = """
local total, mine = 0, 0
for _, tenant in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  local ids = ARGV[1] .. tenant
  redis.call('ZREMRANGEBYSCORE', ids, '-inf', ARGV[6])
  local count = redis.call('ZCARD', ids)
  if count == 0 then
    redis.call('SREM', KEYS[1], tenant)
    redis.call('HDEL', KEYS[2], tenant)
  else
    total = total + tonumber(redis.call('HGET', KEYS[2], tenant) or '1')
    if tenant == ARGV[2] then mine = count end
  end
end
if mine == 0 then total = total + tonumber(ARGV[3]) end
local share = math.max(1, math.floor(tonumber(ARGV[4]) * tonumber(ARGV[3]) / total))
if mine >= share then return 0 end
for i = 7, #ARGV do redis.call('ZADD', ARGV[1] .. ARGV[2], ARGV[5], ARGV[i]) end
redis.call('SADD', KEYS[1], ARGV[2])
redis.call('HSET', KEYS[2], ARGV[2], ARGV[3])
return 1
"""

@dataclass(order=True)
class _Waiter:
    priority: int
    order: int
    ready: asyncio.Future[None] = field(compare=False)


class MemoryShares:
    """The counts of one process (the embedded server)."""

    def __init__(self) -> None:
        self._in_flight: dict[str, dict[str, float]] = {}  # tenant -> id -> lease expiry (monotonic s)
        self._weights: dict[str, float] = {}

    async def enter(self, tenant: str, weight: float, capacity: int, request_ids: list[str], lease_s: float) -> bool:
        now = time.monotonic()
        total, mine = 0.0, 0
        for name, ids in list(self._in_flight.items()):
            for expired in [key for key, expiry in ids.items() if expiry <= now]:
                del ids[expired]
            if not ids:
                del self._in_flight[name]
                continue
            total += self._weights.get(name, 1.0)
            mine = len(ids) if name == tenant else mine
        total += weight if mine == 0 else 0.0
        if mine >= max(1, int(capacity * weight / total)):
            return False
        self._in_flight.setdefault(tenant, {}).update(dict.fromkeys(request_ids, now + lease_s))
        self._weights[tenant] = weight
        return True

    async def leave(self, tenant: str, request_id: str) -> None:
        self._in_flight.get(tenant, {}).pop(request_id, None)


class RedisShares:
    """The counts every gateway of a deployment shares."""

    def __init__(self, redis: aioredis.Redis, prefix: str) -> None:
        self.redis = redis
        self.tenants_key, self.weights_key = f"{prefix}:fair:tenants", f"{prefix}:fair:weights"
        self.ids_prefix = f"{prefix}:fair:ids:"
        self._enter = redis.register_script(_ENTER)

    async def enter(self, tenant: str, weight: float, capacity: int, request_ids: list[str], lease_s: float) -> bool:
        now_ms = int(time.time() * 1000)
        entered = await self._enter(keys=[self.tenants_key, self.weights_key], args=[
            self.ids_prefix, tenant, weight, capacity, now_ms + int(lease_s * 1000), now_ms, *request_ids])
        return bool(entered)

    async def leave(self, tenant: str, request_id: str) -> None:
        await self.redis.zrem(self.ids_prefix + tenant, request_id)


class FairGate:
    """Holds a tenant's requests beyond its share until it holds fewer; the most urgent of a tenant's
    waiting requests (then the oldest) goes first."""

    def __init__(self, shares: MemoryShares | RedisShares, capacity: Callable[[], Awaitable[int | None]],
                 lease_s: float = 900.0) -> None:
        self.shares = shares
        self.capacity = capacity  # the fleet's --max-in-flight summed; None: unknown (no limit)
        self.lease_s = lease_s
        self._waiting: dict[str, list[_Waiter]] = {}
        self._tenant_of: dict[str, str] = {}  # id in flight through this gateway -> tenant
        self._order = itertools.count()

    async def enter(self, wires: list[WireRequest]) -> None:
        """Return once one request's prompts (`wires`, one tenant's) may go to the workers: at once while
        its tenant is under its share. They enter together and all count from then on, so a request of
        more prompts than the share never waits for itself."""
        wires = [wire for wire in wires if wire.id not in self._tenant_of]  # retries attach to what counts
        if not wires:
            return
        first = wires[0]
        tenant = first.tenant or DEFAULT_TENANT
        waiter = _Waiter(first.priority, next(self._order), asyncio.get_running_loop().create_future())
        queue = self._waiting.setdefault(tenant, [])
        heapq.heappush(queue, waiter)
        try:
            while not (queue[0] is waiter and await self._try(tenant, wires)):
                await self._wait_turn(waiter)
        finally:
            queue.remove(waiter)
            heapq.heapify(queue)
            if not queue:
                self._waiting.pop(tenant, None)
            self._wake(tenant)

    async def leave(self, request_id: str) -> None:
        tenant = self._tenant_of.pop(request_id, None)
        if tenant is not None:
            await self.shares.leave(tenant, request_id)
            self._wake(tenant)

    async def _try(self, tenant: str, wires: list[WireRequest]) -> bool:
        capacity = await self.capacity()
        lease_s = self.lease_s
        deadline_ms = wires[0].deadline_ms
        if deadline_ms is not None:
            lease_s = max(1.0, deadline_ms / 1000 - time.time())
        ids = [wire.id for wire in wires]
        if capacity is not None and not await self.shares.enter(tenant, wires[0].tenant_weight, capacity, ids,
                                                                lease_s):
            return False
        self._tenant_of.update(dict.fromkeys(ids, tenant))
        return True

    async def _wait_turn(self, waiter: _Waiter) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(waiter.ready), RETRY_S)
        if waiter.ready.done():
            waiter.ready = asyncio.get_running_loop().create_future()

    def _wake(self, tenant: str) -> None:
        queue = self._waiting.get(tenant)
        if queue and not queue[0].ready.done():
            queue[0].ready.set_result(None)
