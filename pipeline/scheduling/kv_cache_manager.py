"""Maps sequences to KV blocks: allocation for the tokens a step computes, and prefix-cache hits.

Full blocks are named by a chain hash: hash(parent block's hash, this block's token ids,
cache salt), so a block is only reused after an identical prefix. Example with block_size 4:
tokens [5 6 7 8 | 9 1 2 3 | 4] -> two full blocks with hashes h0 = H(root, (5,6,7,8)),
h1 = H(h0, (9,1,2,3)); the trailing partial block is never cached.

Sliding window W (every layer windowed): the next token computed at position p reads keys from
p - W + 1 on, so a block whose last position is below that is never read again. Those blocks go
back to the pool while the sequence runs (they stay in the prefix cache until evicted), and
their entries in the sequence's block list become NULL_BLOCK. A prefix hit then needs only the
blocks the first computed token can see: with block_size 4 and W 6, a hit on 12 tokens needs
blocks 1 and 2 (positions 7..11), whatever happened to block 0.

Images: a block holding placeholder tokens of an image also hashes the image's content hash, so
the same prompt with another image shares only the blocks before the first placeholder.

Placement: when `publish_prefix_keys` is on, cached blocks also carry their process-stable
placement keys (prefix_keys.py) into the pool's journal, which the worker publishes to the fleet.
"""

from __future__ import annotations

from pipeline.request.image_input import overlapping
from pipeline.request.request import Sequence
from pipeline.scheduling.block_pool import BlockPool
from pipeline.scheduling.prefix_journal import PrefixJournal
from pipeline.scheduling.prefix_keys import extend_prefix_keys

NULL_BLOCK = -1  # a block-list entry released outside the sliding window (never read)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True,
                 sliding_window: int | None = None) -> None:
        if sliding_window is not None and sliding_window < 1:
            raise ValueError(f"sliding_window must be >= 1 or None, got {sliding_window}")
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.sliding_window = sliding_window
        self.pool = BlockPool(num_blocks)

    def publish_prefix_keys(self) -> PrefixJournal:
        """Record the placement keys of cached blocks from now on; the journal they go to."""
        if self.pool.journal is None:
            self.pool.journal = PrefixJournal()
        return self.pool.journal

    def first_needed_block(self, num_computed_tokens: int) -> int:
        """Index of the first block the token at position num_computed_tokens (the next one
        computed) can see; every block before it is never read again. 0 without a window."""
        if self.sliding_window is None:
            return 0
        return max(0, num_computed_tokens - self.sliding_window + 1) // self.block_size

    def max_blocks_per_sequence(self, max_num_new_tokens: int) -> int | None:
        """The most blocks a sequence holds at once when a step computes up to max_num_new_tokens
        of it (None: unbounded, it grows with its length). W - 1 visible old tokens plus the new
        ones, spread over whole blocks: at most cdiv(W - 1 + new, block_size) + 1."""
        if self.sliding_window is None:
            return None
        return cdiv(self.sliding_window - 1 + max_num_new_tokens, self.block_size) + 1

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    def find_cached_prefix(self, seq: Sequence) -> list[int]:
        """Block ids of the longest cached prefix of seq (NULL_BLOCK where a window makes a block
        unnecessary). The last token is never covered, so the step that resumes the sequence
        still computes it and produces logits."""
        if not self._uses_prefix_cache(seq):
            return []
        num_full = (seq.num_tokens - 1) // self.block_size
        self._extend_hashes(seq, num_full)
        found: list[int] = []
        best = run_start = 0  # best: blocks in the longest usable prefix; run_start: first block of the current run
        for index in range(num_full):
            block_id = self.pool.lookup(seq.block_hashes[index], self._block_tokens(seq, index))
            if block_id is None:
                if self.sliding_window is None:
                    break  # without a window every block of the prefix is needed
                found.append(NULL_BLOCK)
                run_start = index + 1
                continue
            found.append(block_id)
            if run_start <= self.first_needed_block((index + 1) * self.block_size):
                best = index + 1
        first = self.first_needed_block(best * self.block_size)
        return [NULL_BLOCK] * first + found[first:best]

    def allocate(self, seq: Sequence, num_new_tokens: int, cached_block_ids: list[int] | None = None) -> bool:
        """Give seq blocks for `num_new_tokens` more tokens (after its computed ones, or after the
        cached prefix when one is passed). Returns False when blocks run out, having changed
        nothing but the release of blocks outside the sliding window (never needed again)."""
        cached_block_ids = cached_block_ids or []
        if not cached_block_ids:
            self._free_outside_window(seq)
        num_computed = len(cached_block_ids) * self.block_size if cached_block_ids else seq.num_computed_tokens
        total_tokens = num_computed + num_new_tokens
        num_needed = max(0, cdiv(total_tokens, self.block_size) - len(seq.block_ids) - len(cached_block_ids))
        # Cached blocks with no other user sit in the free queue: reviving them uses free capacity.
        if num_needed + self.pool.count_free_among(cached_block_ids) > self.pool.num_free_blocks:
            return False
        self.pool.touch(cached_block_ids)
        seq.block_ids.extend(cached_block_ids)
        seq.num_released_blocks = max(seq.num_released_blocks, cached_block_ids.count(NULL_BLOCK))
        seq.num_published_blocks = max(seq.num_published_blocks, len(cached_block_ids))
        if num_needed:
            seq.block_ids.extend(self.pool.allocate(num_needed))
        if self._uses_prefix_cache(seq):
            self._cache_full_blocks(seq, total_tokens)
        return True

    def free(self, seq: Sequence) -> None:
        self.pool.free([block_id for block_id in reversed(seq.block_ids) if block_id != NULL_BLOCK])
        seq.block_ids = []
        seq.num_published_blocks = 0
        seq.num_released_blocks = 0

    def settle_draft(self, seq: Sequence) -> None:
        """After a draft's verification (num_computed_tokens counts the accepted draft tokens): give
        back the blocks past the computed tokens, which only rejected draft tokens used, and publish
        the blocks the accepted ones filled. The sequence then holds what plain decoding would, and
        the prefix cache only ever names accepted tokens (publishing stops at the known tokens)."""
        keep = cdiv(seq.num_computed_tokens, self.block_size)
        tail = seq.block_ids[keep:]
        if tail:
            self.pool.free([block_id for block_id in reversed(tail) if block_id != NULL_BLOCK])
            del seq.block_ids[keep:]
        if self._uses_prefix_cache(seq):
            self._cache_full_blocks(seq, seq.num_computed_tokens)

    @property
    def num_used_blocks(self) -> int:
        return self.pool.num_used_blocks

    def _free_outside_window(self, seq: Sequence) -> None:
        """Release the blocks before the first one the next computed token can see."""
        first_needed = min(self.first_needed_block(seq.num_computed_tokens), len(seq.block_ids))
        released = [block_id for block_id in seq.block_ids[seq.num_released_blocks:first_needed]
                    if block_id != NULL_BLOCK]
        if released:
            self.pool.free(released)
        seq.block_ids[seq.num_released_blocks:first_needed] = [NULL_BLOCK] * (first_needed - seq.num_released_blocks)
        seq.num_released_blocks = max(seq.num_released_blocks, first_needed)

    def _uses_prefix_cache(self, seq: Sequence) -> bool:
        # Prompt logprobs need logits for every prompt token, so such requests compute them all.
        return self.enable_prefix_caching and seq.params.prompt_logprobs is None

    def _cache_full_blocks(self, seq: Sequence, num_tokens: int) -> None:
        """Publish the blocks that are full once the scheduled tokens are computed. Steps run in
        order on the device, so a later step may read them even if this one is still running."""
        # A block holding a placeholder (pipeline/scheduling/lookahead.py) is published once its value is known.
        num_full = min(num_tokens, seq.num_known_tokens) // self.block_size
        self._extend_hashes(seq, num_full)
        keys = self._prefix_keys(seq, num_full)
        for index in range(seq.num_published_blocks, num_full):
            self.pool.cache_block(seq.block_ids[index], seq.block_hashes[index], self._block_tokens(seq, index),
                                  keys[index] if index < len(keys) else None)
        seq.num_published_blocks = max(seq.num_published_blocks, num_full)

    def _prefix_keys(self, seq: Sequence, num_full_blocks: int) -> list[bytes]:
        """The sequence's placement keys up to num_full_blocks, stopping at its first image block."""
        if self.pool.journal is None:
            return seq.prefix_keys
        images = seq.request.images
        if images:
            first_image_block = min(image.offset for image in images) // self.block_size
            num_full_blocks = min(num_full_blocks, first_image_block)
        extend_prefix_keys(seq.prefix_keys, seq.token_ids, self.block_size, num_full_blocks, seq.request.lora_name)
        return seq.prefix_keys

    def _extend_hashes(self, seq: Sequence, num_full_blocks: int) -> None:
        hashes = seq.block_hashes
        for index in range(len(hashes), num_full_blocks):
            parent = hashes[index - 1] if index else hash(("aqueduct-root", seq.request.cache_salt))
            hashes.append(hash((parent, self._block_tokens(seq, index), *self._block_images(seq, index))))

    def _block_images(self, seq: Sequence, index: int) -> tuple[str, ...]:
        """Content hashes of the images with placeholders in block `index` (usually none)."""
        if not seq.request.images:
            return ()
        start = index * self.block_size
        return tuple(image.content_hash for image in overlapping(seq.request.images, start, start + self.block_size))

    def _block_tokens(self, seq: Sequence, index: int) -> tuple[int, ...]:
        start = index * self.block_size
        return tuple(seq.token_ids[start:start + self.block_size])
