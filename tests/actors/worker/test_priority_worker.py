"""Priorities and fair share through a worker on a real Redis: urgent requests queued behind bulk ones
are read first (their lane) and scheduled first (the priority policy); a tenant's flood queued first
does not hold back another tenant's few requests of the same priority once the worker holds both (the
lane is FIFO); every request is answered once."""

from __future__ import annotations

from typing import Any

import pytest

from queue_adapters.client import AqueductClient
from queue_adapters.codec import WireRequest
from queue_adapters.priority_lanes import LANES, lane_key
from tests.conftest import REDIS_URL
from tests.support.hf_models import make_tiny_hf_model
from tests.support.worker_helpers import read_replies, running_workers, tokens_of

pytestmark = pytest.mark.redis


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_hf_model("llama", tmp_path_factory.mktemp("llama"), seed=3)


def _request(request_id: str, first: int, max_tokens: int, **fields: Any) -> WireRequest:
    return WireRequest(id=request_id, prompt_token_ids=[first % 500 + 3, 7, 9, 11], **fields,
                       params={"max_tokens": max_tokens, "temperature": 0, "ignore_eos": True})


async def _finish_order(redis, prefix: str, requests: list[WireRequest], max_tokens: int) -> list[str]:
    """The requests' ids by the id of their reply stream's final entry (when it was written)."""
    finals = {}
    for request in requests:
        entries = await read_replies(redis, f"{prefix}:out:{request.id}")
        assert len(tokens_of(entries)) == max_tokens, request.id
        stream = await redis.xrevrange(f"{prefix}:out:{request.id}", count=1)
        finals[request.id] = tuple(int(part) for part in stream[0][0].decode().split("-"))
    return sorted(finals, key=finals.get)


async def test_urgent_requests_queued_after_bulk_ones_finish_first(model_dir, prefix):
    bulk = [_request(f"bulk{i}", i, 12, priority=10) for i in range(16)]
    urgent = [_request(f"urgent{i}", 100 + i, 12, priority=-1) for i in range(4)]
    async with AqueductClient(REDIS_URL, prefix=prefix) as client:
        await client.submit_many(bulk)  # queued before any worker reads: all bulk ahead in time
        await client.submit_many(urgent)
    async with running_workers(model_dir, prefix, max_num_seqs=2, max_in_flight=3, block_size=4) as (redis, _):
        order = await _finish_order(redis, prefix, urgent + bulk, 12)
        for lane in LANES:
            assert (await redis.xpending(lane_key(prefix, lane), "workers"))["pending"] == 0
    # All four urgent requests finish before the 16 bulk ones except the few read beside them
    # (a read of 3 leaves one entry to a less urgent lane).
    last_urgent = max(order.index(request.id) for request in urgent)
    assert last_urgent <= 4 + 2, order
    assert set(order) == {request.id for request in urgent + bulk}


async def test_a_later_tenants_requests_interleave_with_an_earlier_flood(model_dir, prefix):
    flood = [_request(f"a{i}", i, 8, tenant="alice") for i in range(24)]
    few = [_request(f"b{i}", 100 + i, 8, tenant="bob") for i in range(4)]
    async with AqueductClient(REDIS_URL, prefix=prefix) as client:
        await client.submit_many(flood)  # all of alice's queued before bob's
        await client.submit_many(few)
    async with running_workers(model_dir, prefix, max_num_seqs=2, max_in_flight=64, block_size=4) as (redis, _):
        order = await _finish_order(redis, prefix, flood + few, 8)
    last_bob = max(order.index(request.id) for request in few)
    # One for one once both wait: bob's 4 end among the first ~10, not after alice's 24 (the first
    # read may admit a few of alice's before bob's arrive).
    assert last_bob <= 4 * 2 + 4, order
