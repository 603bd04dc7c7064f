"""Placement keys (pipeline/scheduling/prefix_keys.py) and the block pool's journal of them: what a
worker publishes equals what an entry point computes for the same prompt, and the journal follows
caching, eviction and resets."""

from __future__ import annotations

import subprocess
import sys

from pipeline.request.request import Request
from pipeline.request.sampling_params import SamplingParams
from pipeline.scheduling.block_pool import BlockPool
from pipeline.scheduling.kv_cache_manager import KVCacheManager
from pipeline.scheduling.prefix_journal import PrefixJournal
from pipeline.scheduling.prefix_keys import prefix_keys


def test_keys_chain_over_full_blocks_and_salt():
    keys = prefix_keys(list(range(10)), 4)
    assert len(keys) == 2 and all(len(key) == 8 for key in keys)  # the partial third block has none
    assert prefix_keys([*range(8), 99, 98], 4) == keys  # a block's key depends only on what precedes it
    assert prefix_keys([0, 1, 2, 3, 7, 5, 6, 7], 4)[1] != keys[1]
    assert prefix_keys(list(range(8)), 4, "adapter")[0] != keys[0]
    assert prefix_keys(list(range(100)), 4, max_blocks=3) == prefix_keys(list(range(12)), 4)


def test_keys_are_the_same_in_another_process():
    """Unlike Python's hash of strings, which is randomised per process."""
    code = ("from pipeline.scheduling.prefix_keys import prefix_keys; "
            "print(prefix_keys(list(range(32)), 16, 'lora-a')[1].hex())")
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert other == prefix_keys(list(range(32)), 16, "lora-a")[1].hex()


def test_journal_keeps_each_keys_last_change():
    journal = PrefixJournal()
    journal.add(b"a")
    journal.add(b"b")
    journal.remove(b"b")
    assert journal.drain() == (False, {b"a"}, {b"b"})
    journal.remove(b"a")
    journal.add(b"a")
    journal.clear()
    journal.add(b"c")
    assert journal.drain() == (True, {b"c"}, set())
    assert journal.drain() == (False, set(), set())


def test_pool_journals_a_key_until_its_last_block_is_evicted():
    pool = BlockPool(3)
    pool.journal = PrefixJournal()
    first, second = pool.allocate(2)
    pool.cache_block(first, 11, (1,), b"k")
    pool.cache_block(second, 12, (1,), b"k")  # one adapter name, two loads: two blocks, one key
    assert pool.journal.drain() == (False, {b"k"}, set())
    pool.free([first, second])
    pool.allocate(2)  # the never-used block, then the first: the key still names the second
    assert pool.journal.drain() == (False, set(), set())
    pool.allocate(1)
    assert pool.journal.drain() == (False, set(), {b"k"})
    assert pool.published_prefix_keys() == []


def _request(token_ids: list[int], lora_name: str | None = None) -> Request:
    return Request("r", token_ids, SamplingParams(max_tokens=4), seed=0, lora_name=lora_name, lora_id=1 if lora_name
                   else None)


def test_cached_blocks_publish_the_keys_an_entry_point_computes():
    manager = KVCacheManager(num_blocks=16, block_size=4)
    journal = manager.publish_prefix_keys()
    prompt = list(range(3, 14))  # 11 tokens: two full blocks
    seq = _request(prompt, "ad").sequences[0]
    assert manager.allocate(seq, len(prompt))
    assert journal.drain() == (False, set(prefix_keys(prompt, 4, "ad")), set())
    manager.free(seq)
    manager.pool.reset_prefix_cache()
    assert journal.drain()[0] is True
