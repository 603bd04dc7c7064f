"""Maps sequences to KV blocks: allocation for the tokens a step computes, and prefix-cache hits.

Full blocks are named by a chain hash: hash(parent block's hash, this block's token ids,
cache salt), so a block is only reused after an identical prefix. Example with block_size 4:
tokens [5 6 7 8 | 9 1 2 3 | 4] -> two full blocks with hashes h0 = H(root, (5,6,7,8)),
h1 = H(h0, (9,1,2,3)); the trailing partial block is never cached.
"""

from __future__ import annotations

from pipeline.block_pool import BlockPool
from pipeline.request import Sequence


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True) -> None:
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.pool = BlockPool(num_blocks)

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    def find_cached_prefix(self, seq: Sequence) -> list[int]:
        """Block ids of the longest cached prefix of seq. The last token is never covered, so the
        step that resumes the sequence still computes it and produces logits."""
        if not self._uses_prefix_cache(seq):
            return []
        num_full = (seq.num_tokens - 1) // self.block_size
        self._extend_hashes(seq, num_full)
        block_ids = []
        for index in range(num_full):
            block_id = self.pool.lookup(seq.block_hashes[index], self._block_tokens(seq, index))
            if block_id is None:
                break
            block_ids.append(block_id)
        return block_ids

    def allocate(self, seq: Sequence, num_new_tokens: int, cached_block_ids: list[int] | None = None) -> bool:
        """Give seq blocks for `num_new_tokens` more tokens (after its computed ones, or after the
        cached prefix when one is passed). Returns False, changing nothing, when blocks run out."""
        cached_block_ids = cached_block_ids or []
        num_computed = len(cached_block_ids) * self.block_size if cached_block_ids else seq.num_computed_tokens
        total_tokens = num_computed + num_new_tokens
        num_needed = max(0, cdiv(total_tokens, self.block_size) - len(seq.block_ids) - len(cached_block_ids))
        # Cached blocks with no other user sit in the free queue: reviving them uses free capacity.
        if num_needed + self.pool.count_free_among(cached_block_ids) > self.pool.num_free_blocks:
            return False
        self.pool.touch(cached_block_ids)
        seq.block_ids.extend(cached_block_ids)
        seq.num_published_blocks = max(seq.num_published_blocks, len(cached_block_ids))
        if num_needed:
            seq.block_ids.extend(self.pool.allocate(num_needed))
        if self._uses_prefix_cache(seq):
            self._cache_full_blocks(seq, total_tokens)
        return True

    def free(self, seq: Sequence) -> None:
        self.pool.free(seq.block_ids[::-1])
        seq.block_ids = []
        seq.num_published_blocks = 0

    def _uses_prefix_cache(self, seq: Sequence) -> bool:
        # Prompt logprobs need logits for every prompt token, so such requests compute them all.
        return self.enable_prefix_caching and seq.params.prompt_logprobs is None

    def _cache_full_blocks(self, seq: Sequence, num_tokens: int) -> None:
        """Publish the blocks that are full once the scheduled tokens are computed. Steps run in
        order on the device, so a later step may read them even if this one is still running."""
        num_full = num_tokens // self.block_size
        self._extend_hashes(seq, num_full)
        for index in range(seq.num_published_blocks, num_full):
            self.pool.cache_block(seq.block_ids[index], seq.block_hashes[index], self._block_tokens(seq, index))
        seq.num_published_blocks = max(seq.num_published_blocks, num_full)

    def _extend_hashes(self, seq: Sequence, num_full_blocks: int) -> None:
        hashes = seq.block_hashes
        for index in range(len(hashes), num_full_blocks):
            parent = hashes[index - 1] if index else hash(("aqueduct-root", seq.request.cache_salt))
            hashes.append(hash((parent, self._block_tokens(seq, index))))

    def _block_tokens(self, seq: Sequence, index: int) -> tuple[int, ...]:
        start = index * self.block_size
        return tuple(seq.token_ids[start:start + self.block_size])
