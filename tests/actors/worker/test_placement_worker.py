"""Prefix placement through workers on a real Redis: each turn of a conversation goes to the worker
that served (and cached) the turns before it, and finds its prefix cached there; a request whose
prefix holder is full is not held up behind it; and every request is answered once."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis

from actors.worker.admission import Admission
from actors.worker.placement import PrefixPublisher
from pipeline.scheduling.block_pool import BlockPool
from pipeline.scheduling.prefix_journal import PrefixJournal
from queue_adapters import stealing
from queue_adapters.client import AqueductClient
from queue_adapters.codec import WireRequest, encode
from queue_adapters.placement import RECENT_OFFER_S, Placement, PrefixDirectory, blocks_key, room_key
from queue_adapters.priority_lanes import LANES, lane_key
from tests.conftest import REDIS_URL
from tests.support.hf_models import make_tiny_hf_model
from tests.support.worker_helpers import read_replies, running_workers, tokens_of

pytestmark = pytest.mark.redis

BLOCK = 4
LONG_TOKENS = 2000  # ~0.5 s and more of a tiny model's decode, even on a fast CPU


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    # Room for a long request (LONG_TOKENS) that keeps a worker busy well past the placement wait.
    return make_tiny_hf_model("llama", tmp_path_factory.mktemp("llama"), seed=5, max_position_embeddings=2048)


async def _owner(redis: aioredis.Redis, prefix: str, request_id: str) -> str:
    value = await redis.get(f"{prefix}:owner:{request_id}")
    return value.decode().rsplit("\n", 1)[-1]


async def _turn(client: AqueductClient, redis: aioredis.Redis, prefix: str, request_id: str,
                prompt: list[int]) -> tuple[list[int], dict]:
    await client.submit(WireRequest(id=request_id, prompt_token_ids=prompt,
                                    params={"max_tokens": 6, "temperature": 0, "ignore_eos": True}))
    entries = await read_replies(redis, f"{prefix}:out:{request_id}")
    return tokens_of(entries), entries[-1]["usage"]


async def _published(redis: aioredis.Redis, prefix: str, workers: list[str], key: bytes | None = None) -> None:
    """Until a worker's directory names what it cached (it publishes every 50 ms): anything, or the
    block `key`. A later turn is placed by its history's blocks: on a fast box the next turn came
    before the last one's blocks were published, while another conversation's already were."""
    for _ in range(100):
        if any([await (redis.scard(blocks_key(prefix, worker)) if key is None
                       else redis.sismember(blocks_key(prefix, worker), key)) for worker in workers]):
            return
        await asyncio.sleep(0.05)
    raise TimeoutError("no worker published its cached prefixes")


async def test_each_turn_of_a_conversation_goes_to_the_worker_caching_its_history(model_dir, prefix):
    conversations = {f"c{c}": [7 + c, *range(20 + 40 * c, 44 + 40 * c)] for c in range(3)}  # 25 tokens each
    async with running_workers(model_dir, prefix, count=2, block_size=BLOCK, max_num_seqs=4) as (redis, _):
        placement = Placement(PrefixDirectory(redis, prefix), BLOCK)
        owners: dict[str, set[str]] = {name: set() for name in conversations}
        async with AqueductClient(REDIS_URL, prefix=prefix, redis=redis, placement=placement) as client:
            for turn in range(3):
                for name, history in conversations.items():
                    keys = placement.keys_of(WireRequest(id="probe", prompt_token_ids=history))
                    reply, usage = await _turn(client, redis, prefix, f"{name}-t{turn}", history)
                    owners[name].add(await _owner(redis, prefix, f"{name}-t{turn}"))
                    if turn:  # everything but the new user message and the last block's rest was cached
                        assert usage["cached_tokens"] >= len(history) - 3 - BLOCK, (name, turn, usage)
                    history += [*reply, 3 + turn, 4, 5]  # the assistant's answer, then the next user message
                    await _published(redis, prefix, ["w0", "w1"], keys[-1])  # this turn's prompt blocks
        assert all(len(served_by) == 1 for served_by in owners.values()), owners
        for lane in LANES:
            assert (await redis.xpending(lane_key(prefix, lane), "workers"))["pending"] == 0


async def test_a_request_is_not_held_up_behind_the_full_worker_that_holds_its_prefix(model_dir, prefix, monkeypatch):
    # Workers re-read the worker list at most once a second; the other worker must know the holder
    # (and steal its offer) well before the long request ends.
    monkeypatch.setattr(stealing, "WORKER_LIST_TTL_S", 0.05)
    history = [9, *range(100, 124)]
    async with running_workers(model_dir, prefix, count=2, block_size=BLOCK, max_num_seqs=1,
                               max_in_flight=1) as (redis, _):
        placement = Placement(PrefixDirectory(redis, prefix), BLOCK)
        async with AqueductClient(REDIS_URL, prefix=prefix, redis=redis, placement=placement) as client:
            await _turn(client, redis, prefix, "first", history)
            holder = await _owner(redis, prefix, "first")
            await _published(redis, prefix, [holder])
            # The entry counts its offer of "first" against the holder's room for RECENT_OFFER_S: past
            # that, with the holder's room published again, "long" goes to the holder.
            await asyncio.sleep(RECENT_OFFER_S)
            while int(await redis.get(room_key(prefix, holder)) or 0) < 1:
                await asyncio.sleep(0.01)
            # A long request with the same prefix goes to the holder and keeps it busy...
            await client.submit(WireRequest(id="long", prompt_token_ids=[*history, 1],
                                            params={"max_tokens": LONG_TOKENS, "temperature": 0, "ignore_eos": True}))
            while not await redis.exists(f"{prefix}:out:long"):
                await asyncio.sleep(0.01)
            assert await _owner(redis, prefix, "long") == holder
            # ...and the next one, offered to the holder too (as by an entry point that read its room
            # before it filled), is taken by the other worker once it waited past the placement wait.
            after = WireRequest(id="next", prompt_token_ids=[*history, 2], params={"max_tokens": 6, "temperature": 0})
            stream, _ = await placement.directory.offer(encode(after), 0, holder)
            assert stream.endswith(f":at:{holder}")
            await read_replies(redis, f"{prefix}:out:next")
            assert await _owner(redis, prefix, "next") != holder
            long_replies = await redis.xlen(f"{prefix}:out:long")
            assert long_replies < LONG_TOKENS, "the long request had finished: nothing was held up"
            await read_replies(redis, f"{prefix}:out:long")


async def test_the_directory_is_published_whole_again_after_it_was_lost(prefix):
    """A worker whose heartbeat lapsed on a stalled machine may see its directory retired by another:
    the next publish notices the set is gone and the one after restores it whole."""
    pool = BlockPool(4)
    pool.journal = PrefixJournal()
    block = pool.allocate(1)[0]
    pool.cache_block(block, 1, (1,), b"key-one!")
    redis = aioredis.Redis.from_url(REDIS_URL)
    publisher = PrefixPublisher(redis, prefix, "w", pool, Admission(4), ttl_ms=30_000)
    await publisher.publish()
    assert await redis.smembers(blocks_key(prefix, "w")) == {b"key-one!"}
    await redis.delete(blocks_key(prefix, "w"))
    publisher._refreshed_at = float("-inf")  # as when the refresh is due
    await publisher.publish()
    publisher._refreshed_at = float("-inf")
    await publisher.publish()
    assert await redis.smembers(blocks_key(prefix, "w")) == {b"key-one!"}
    await redis.aclose()
