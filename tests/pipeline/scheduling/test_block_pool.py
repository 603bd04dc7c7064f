from pipeline.scheduling.block_pool import BlockPool
from pipeline.scheduling.kv_cache_manager import KVCacheManager
from tests.support.engine_sim import make_request


def test_allocate_and_free_keep_counts_consistent():
    pool = BlockPool(8)
    first = pool.allocate(3)
    second = pool.allocate(2)
    assert pool.num_free_blocks == 3
    assert len(set(first) | set(second)) == 5
    pool.free(first[::-1])
    assert pool.num_free_blocks == 6
    assert (pool.ref_counts >= 0).all()


def test_allocation_beyond_capacity_raises():
    pool = BlockPool(2)
    pool.allocate(2)
    try:
        pool.allocate(1)
    except RuntimeError as error:
        assert "only 0 free" in str(error)
    else:
        raise AssertionError("expected RuntimeError")


def test_freed_cached_block_is_reusable_until_evicted():
    pool = BlockPool(2)
    [block] = pool.allocate(1)
    pool.cache_block(block, block_hash=123, token_ids=(1, 2))
    pool.free([block])
    assert pool.lookup(123, (1, 2)) == block
    pool.allocate(2)  # takes the free block at the head first: the cached one is evicted
    assert pool.lookup(123, (1, 2)) is None


def test_lookup_checks_tokens_against_hash_collisions():
    pool = BlockPool(2)
    [block] = pool.allocate(1)
    pool.cache_block(block, block_hash=7, token_ids=(1, 2))
    assert pool.lookup(7, (9, 9)) is None


def test_touch_revives_a_free_cached_block():
    pool = BlockPool(3)
    [block] = pool.allocate(1)
    pool.cache_block(block, 5, (1,))
    pool.free([block])
    assert pool.num_free_blocks == 3
    pool.touch([block])
    assert pool.num_free_blocks == 2 and pool.ref_counts[block] == 1


def test_prefix_hit_shares_full_blocks_and_never_covers_the_last_token():
    kv = KVCacheManager(num_blocks=16, block_size=4)
    first = make_request("a", prompt_len=12).sequences[0]
    assert kv.allocate(first, 12)
    second = make_request("b", prompt_len=12).sequences[0]  # identical prompt
    cached = kv.find_cached_prefix(second)
    # 12 tokens = 3 full blocks, but the last token must be computed: only 2 blocks are reused.
    assert cached == first.block_ids[:2]
    assert kv.allocate(second, 4, cached)
    assert second.block_ids[:2] == first.block_ids[:2]
    assert kv.pool.ref_counts[first.block_ids[0]] == 2


def test_prefix_cache_key_includes_the_salt():
    kv = KVCacheManager(num_blocks=16, block_size=4)
    first = make_request("a", prompt_len=12).sequences[0]
    kv.allocate(first, 12)
    other = make_request("b", prompt_len=12)
    other.cache_salt = 42  # e.g. another LoRA adapter
    assert kv.find_cached_prefix(other.sequences[0]) == []


def test_failed_allocation_changes_nothing():
    kv = KVCacheManager(num_blocks=2, block_size=4)
    seq = make_request("a", prompt_len=12).sequences[0]
    assert not kv.allocate(seq, 12)
    assert seq.block_ids == [] and kv.num_free_blocks == 2
