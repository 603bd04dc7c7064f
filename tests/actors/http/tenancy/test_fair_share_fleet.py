"""Fair share across the fleet, through a gateway and a worker on a real Redis: one tenant's flood,
sent first, does not hold back another tenant's few requests, which run beside it as soon as seats
free; every request of both is answered once."""

from __future__ import annotations

import asyncio
import time

import pytest

from actors.http.backends import RemoteBackend
from queue_adapters.codec import WireRequest
from tests.conftest import REDIS_URL
from tests.support.hf_models import make_tiny_hf_model
from tests.support.worker_helpers import running_workers

pytestmark = pytest.mark.redis


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_hf_model("llama", tmp_path_factory.mktemp("llama"), seed=11)


async def _run(backend: RemoteBackend, wire: WireRequest, finished: list[str]) -> int:
    await backend.submit(wire)
    tokens = [t for reply in [r async for r in backend.replies(wire)] for c in reply.choices for t in c.token_ids]
    finished.append(wire.id)
    return len(tokens)


def _wire(request_id: str, tenant: str) -> WireRequest:
    return WireRequest(id=request_id, prompt_token_ids=[5, 9, 13, 17], tenant=tenant,
                       params={"max_tokens": 24, "temperature": 0, "ignore_eos": True})


async def test_a_later_tenant_passes_an_earlier_tenants_flood(model_dir, prefix):
    backend = RemoteBackend(REDIS_URL, prefix, "tiny", None)
    await backend.start()
    finished: list[str] = []
    async with running_workers(model_dir, prefix, max_num_seqs=2, max_in_flight=4, block_size=4) as _:
        while await backend.fleet_capacity() is None:  # the worker's heartbeat
            backend._capacity_read_at = float("-inf")
            await asyncio.sleep(0.05)
        flood = [asyncio.create_task(_run(backend, _wire(f"a{i}", "A"), finished)) for i in range(40)]
        await asyncio.sleep(0.2)  # A's flood is in: 4 with the worker, 36 waiting at the gateway
        started, done_before_b = time.monotonic(), len(finished)
        few = [asyncio.create_task(_run(backend, _wire(f"b{i}", "B"), finished)) for i in range(4)]
        assert await asyncio.gather(*few) == [24] * 4
        assert time.monotonic() - started < 30
        assert await asyncio.gather(*flood) == [24] * 40
    await backend.close()
    finishes_until_b_done = max(finished.index(f"b{i}") for i in range(4)) + 1 - done_before_b
    # B's four take the seats A frees, two at a time beside A's two: done within about 8 finishes,
    # not after the rest of A's flood (a FIFO lane would put them behind every A request queued first).
    assert finishes_until_b_done <= 10, (done_before_b, finished)
    assert sorted(finished) == sorted([f"a{i}" for i in range(40)] + [f"b{i}" for i in range(4)])
