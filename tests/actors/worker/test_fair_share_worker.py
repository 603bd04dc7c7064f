"""Fair share through a worker on a real Redis: a tenant's flood queued first does not hold back
another tenant's few requests of the same priority, once the worker holds both (the lane is FIFO)."""

from __future__ import annotations

import pytest

from queue_adapters.client import AqueductClient
from queue_adapters.codec import WireRequest
from tests.conftest import REDIS_URL
from tests.support.hf_models import make_tiny_hf_model
from tests.support.worker_helpers import read_replies, running_workers, tokens_of

pytestmark = pytest.mark.redis


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_hf_model("llama", tmp_path_factory.mktemp("llama"), seed=3)


def _request(request_id: str, tenant: str, first: int) -> WireRequest:
    return WireRequest(id=request_id, prompt_token_ids=[first % 500 + 3, 7, 9, 11], tenant=tenant,
                       params={"max_tokens": 8, "temperature": 0, "ignore_eos": True})


async def test_a_later_tenants_requests_interleave_with_an_earlier_flood(model_dir, prefix):
    flood = [_request(f"a{i}", "alice", i) for i in range(24)]
    few = [_request(f"b{i}", "bob", 100 + i) for i in range(4)]
    async with AqueductClient(REDIS_URL, prefix=prefix) as client:
        await client.submit_many(flood)  # all of alice's queued before bob's
        await client.submit_many(few)
    async with running_workers(model_dir, prefix, max_num_seqs=2, max_in_flight=64, block_size=4) as (redis, _):
        finals = {}
        for request in flood + few:
            entries = await read_replies(redis, f"{prefix}:out:{request.id}")
            assert len(tokens_of(entries)) == 8, request.id
            stream = await redis.xrevrange(f"{prefix}:out:{request.id}", count=1)
            finals[request.id] = tuple(int(part) for part in stream[0][0].decode().split("-"))
    order = sorted(finals, key=finals.get)
    last_bob = max(order.index(request.id) for request in few)
    # One for one once both wait: bob's 4 end among the first ~10, not after alice's 24 (the first
    # read may admit a few of alice's before bob's arrive).
    assert last_bob <= 4 * 2 + 4, order
