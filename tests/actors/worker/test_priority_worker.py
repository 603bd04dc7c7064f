"""Priorities through a worker on a real Redis: urgent requests queued behind bulk ones are read
first (their lane) and scheduled first (the priority policy), and every request is answered once."""

from __future__ import annotations

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


def _request(request_id: str, priority: int, first: int) -> WireRequest:
    return WireRequest(id=request_id, prompt_token_ids=[first % 500 + 3, 7, 9, 11], priority=priority,
                       params={"max_tokens": 12, "temperature": 0, "ignore_eos": True})


async def test_urgent_requests_queued_after_bulk_ones_finish_first(model_dir, prefix):
    bulk = [_request(f"bulk{i}", 10, i) for i in range(16)]
    urgent = [_request(f"urgent{i}", -1, 100 + i) for i in range(4)]
    async with AqueductClient(REDIS_URL, prefix=prefix) as client:
        await client.submit_many(bulk)  # queued before any worker reads: all bulk ahead in time
        await client.submit_many(urgent)
    async with running_workers(model_dir, prefix, max_num_seqs=2, max_in_flight=3, block_size=4) as (redis, _):
        finals = {}
        for request in urgent + bulk:
            entries = await read_replies(redis, f"{prefix}:out:{request.id}")
            assert len(tokens_of(entries)) == 12, request.id
            stream = await redis.xrevrange(f"{prefix}:out:{request.id}", count=1)
            finals[request.id] = tuple(int(part) for part in stream[0][0].decode().split("-"))
        order = sorted(finals, key=finals.get)
        for lane in LANES:
            assert (await redis.xpending(lane_key(prefix, lane), "workers"))["pending"] == 0
    # All four urgent requests finish before the 16 bulk ones except the few read beside them
    # (a read of 3 leaves one entry to a less urgent lane).
    last_urgent = max(order.index(request.id) for request in urgent)
    assert last_urgent <= 4 + 2, order
    assert set(order) == {request.id for request in urgent + bulk}
