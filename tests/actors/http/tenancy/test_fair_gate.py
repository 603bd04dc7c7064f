"""The fair gate (actors/http/tenancy/fair_gate.py): a tenant holds at most its weighted share of the
fleet's capacity in flight; the rest of its requests wait at the entry, most urgent first, while
another tenant's go straight on; the counts are shared by the gateways of one Redis."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis

from actors.http.tenancy.fair_gate import FairGate, MemoryShares, RedisShares
from queue_adapters.codec import WireRequest
from tests.conftest import REDIS_URL


def _wire(request_id: str, tenant: str, priority: int = 0, weight: float = 1.0) -> WireRequest:
    return WireRequest(id=request_id, prompt="x", tenant=tenant, priority=priority, tenant_weight=weight)


def _capacity(value: int | None):
    async def capacity() -> int | None:
        return value
    return capacity


async def _entered(gate: FairGate, wire: WireRequest) -> bool:
    task = asyncio.ensure_future(gate.enter([wire]))
    await asyncio.sleep(0.12)  # past the gate's retry interval
    if task.done():
        return True
    task.cancel()
    return False


async def _flood_then_newcomer(gates: list[FairGate]) -> None:
    """Capacity 4. A alone may hold all 4; once B holds one, each has a share of 2."""
    first, second = gates[0], gates[-1]
    for index in range(4):
        await first.enter([_wire(f"a{index}", "A")])
    waiting = asyncio.ensure_future(first.enter([_wire("a4", "A")]))
    urgent = asyncio.ensure_future(first.enter([_wire("a5", "A", priority=-1)]))
    assert await _entered(second, _wire("b0", "B"))  # under its share: at once, beside A's four
    await asyncio.sleep(0.1)
    assert not waiting.done() and not urgent.done()
    await first.leave("a0")
    await first.leave("a1")
    await asyncio.sleep(0.1)
    assert not waiting.done() and not urgent.done()  # A holds 2 = its share with B in flight
    await first.leave("a2")
    await asyncio.wait_for(urgent, 1.0)  # the urgent one of A's waiting requests first
    assert not waiting.done()
    await second.leave("b0")  # B done: A's share is 4 again
    await asyncio.wait_for(waiting, 1.0)


async def test_a_flooding_tenant_waits_beyond_its_share_and_a_newcomer_does_not() -> None:
    await _flood_then_newcomer([FairGate(MemoryShares(), _capacity(4))])


async def test_a_request_of_more_prompts_than_the_share_enters_whole_and_never_waits_for_itself() -> None:
    """Its prompts enter together (a 70-input embeddings request with 64 seats hung waiting for its own)."""
    gate = FairGate(MemoryShares(), _capacity(4))
    await asyncio.wait_for(gate.enter([_wire(f"big:{index}", "A") for index in range(10)]), 1.0)
    assert not await _entered(gate, _wire("next", "A"))  # A holds 10 of a share of 4
    for index in range(7):
        await gate.leave(f"big:{index}")
    assert await _entered(gate, _wire("next2", "A"))  # 3 left


async def test_weights_divide_the_capacity_and_an_unknown_capacity_limits_nothing() -> None:
    gate = FairGate(MemoryShares(), _capacity(8))
    await gate.enter([_wire("b0", "B", weight=1)])
    for index in range(6):  # weight 3 beside B's 1: 6 of 8
        await gate.enter([_wire(f"a{index}", "A", weight=3)])
    assert not await _entered(gate, _wire("a6", "A", weight=3))
    unlimited = FairGate(MemoryShares(), _capacity(None))
    for index in range(50):
        await unlimited.enter([_wire(f"x{index}", "A")])


@pytest.mark.redis
async def test_gateways_share_the_counts_in_redis(prefix: str) -> None:
    redis = aioredis.Redis.from_url(REDIS_URL)
    gates = [FairGate(RedisShares(redis, prefix), _capacity(4)) for _ in range(2)]
    await _flood_then_newcomer(gates)
    await redis.aclose()


@pytest.mark.redis
async def test_a_lease_ends_the_count_of_a_request_its_gateway_never_finished(prefix: str) -> None:
    redis = aioredis.Redis.from_url(REDIS_URL)
    crashed = FairGate(RedisShares(redis, prefix), _capacity(1), lease_s=0.2)
    await crashed.enter([_wire("a0", "A")])  # its gateway dies: no leave
    other = FairGate(RedisShares(redis, prefix), _capacity(1))
    await asyncio.wait_for(other.enter([_wire("a1", "A")]), 2.0)
    await redis.aclose()
