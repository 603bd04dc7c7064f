"""Physical KV block accounting: ref counts, an O(1) LRU free queue and the prefix-cache map.

A block with ref_count 0 sits in the free queue but keeps its hash, so a later request with the
same prefix can take it back (a prefix-cache hit) until allocation evicts it. Allocation takes
from the queue's head, so the least recently freed block is evicted first.
"""

from __future__ import annotations

from collections import Counter, OrderedDict

import numpy as np

from pipeline.scheduling.prefix_journal import PrefixJournal


class BlockPool:
    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        self.num_blocks = num_blocks
        self.ref_counts = np.zeros(num_blocks, dtype=np.int32)
        # OrderedDict as a linked list: O(1) append, pop from head and removal from the middle.
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self._hash_of_block: dict[int, int] = {}
        self._block_of_hash: dict[int, int] = {}
        self._tokens_of_block: dict[int, tuple[int, ...]] = {}
        # Placement keys of cached blocks, when the worker tells the fleet (None: it does not). A key
        # can name two blocks (one adapter name, two loads), so it leaves the journal with its last.
        self.journal: PrefixJournal | None = None
        self._key_of_block: dict[int, bytes] = {}
        self._blocks_per_key: Counter[bytes] = Counter()

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    def allocate(self, count: int) -> list[int]:
        if count > len(self._free):
            raise RuntimeError(f"asked for {count} KV blocks, only {len(self._free)} free")
        block_ids = []
        for _ in range(count):
            block_id, _ = self._free.popitem(last=False)
            self._evict(block_id)
            self.ref_counts[block_id] = 1
            block_ids.append(block_id)
        return block_ids

    def free(self, block_ids: list[int]) -> None:
        """Drop one reference each. Pass a sequence's blocks tail first: its last blocks are the
        least likely to be shared, so they should be evicted before its first ones."""
        for block_id in block_ids:
            self.ref_counts[block_id] -= 1
            if self.ref_counts[block_id] == 0:
                self._free[block_id] = None

    def lookup(self, block_hash: int, token_ids: tuple[int, ...]) -> int | None:
        """A cached block holding exactly these tokens after this chain hash, or None."""
        block_id = self._block_of_hash.get(block_hash)
        if block_id is None or self._tokens_of_block[block_id] != token_ids:
            return None  # the token check guards against hash collisions
        return block_id

    def touch(self, block_ids: list[int]) -> None:
        """Take a reference on cached blocks found by lookup (they may be in the free queue);
        negative ids (placeholders for blocks not needed) are skipped."""
        for block_id in block_ids:
            if block_id < 0:
                continue
            if self.ref_counts[block_id] == 0:
                del self._free[block_id]
            self.ref_counts[block_id] += 1

    def count_free_among(self, block_ids: list[int]) -> int:
        return sum(1 for block_id in block_ids if block_id >= 0 and self.ref_counts[block_id] == 0)

    def cache_block(self, block_id: int, block_hash: int, token_ids: tuple[int, ...],
                    prefix_key: bytes | None = None) -> None:
        if block_id in self._hash_of_block or block_hash in self._block_of_hash:
            return  # already cached, or an equal block is (then this one stays private)
        self._hash_of_block[block_id] = block_hash
        self._block_of_hash[block_hash] = block_id
        self._tokens_of_block[block_id] = token_ids
        if prefix_key is not None and self.journal is not None:
            self._key_of_block[block_id] = prefix_key
            self._blocks_per_key[prefix_key] += 1
            if self._blocks_per_key[prefix_key] == 1:
                self.journal.add(prefix_key)

    def published_prefix_keys(self) -> list[bytes]:
        """The placement keys of every cached block (what the journal has told, in full)."""
        return list(self._blocks_per_key)

    def reset_prefix_cache(self) -> None:
        self._hash_of_block.clear()
        self._block_of_hash.clear()
        self._tokens_of_block.clear()
        self._key_of_block.clear()
        self._blocks_per_key.clear()
        if self.journal is not None:
            self.journal.clear()

    def _evict(self, block_id: int) -> None:
        block_hash = self._hash_of_block.pop(block_id, None)
        if block_hash is not None:
            del self._block_of_hash[block_hash]
            del self._tokens_of_block[block_id]
        prefix_key = self._key_of_block.pop(block_id, None)
        if prefix_key is not None:
            self._blocks_per_key[prefix_key] -= 1
            if self._blocks_per_key[prefix_key] == 0:
                del self._blocks_per_key[prefix_key]
                assert self.journal is not None
                self.journal.remove(prefix_key)
