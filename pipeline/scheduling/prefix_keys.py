"""Placement keys: a process-stable name for each full block of a prompt, so that the place a
request enters (gateway, batch reader, wire client) and the workers that cache its blocks agree.

The engine's own block hashes (kv_cache_manager.py) salt with the adapter's load id and hash
image contents with Python's `hash`, which is randomised per process for strings: exact inside one
worker, meaningless across two. Placement keys chain the same way over the same token blocks but
with blake2b and the adapter's *name*, so every process computes the same 8-byte key:

    key[0] = B(salt, tokens[0:16]),  key[i] = B(key[i-1], tokens[16i:16i+16])   (block_size 16)

A key is only a hint of where a prefix may be cached: a collision or an adapter reloaded under the
same name costs one misplaced request, never a wrong token (the engine checks its own hashes).
Blocks holding image placeholders end the chain: their content is not known where requests enter.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

KEY_BYTES = 8


def root_key(salt: str | None) -> bytes:
    """The chain's parent before block 0: the adapter's name ('' for the base model)."""
    return hashlib.blake2b(f"aqueduct-prefix\x00{salt or ''}".encode(), digest_size=KEY_BYTES).digest()


def block_key(parent: bytes, block_tokens: Sequence[int]) -> bytes:
    data = np.asarray(block_tokens, dtype="<i8").tobytes()
    return hashlib.blake2b(data, digest_size=KEY_BYTES, key=parent).digest()


def extend_prefix_keys(keys: list[bytes], token_ids: Sequence[int], block_size: int, num_full_blocks: int,
                       salt: str | None) -> None:
    """Grow `keys` in place to the first `num_full_blocks` blocks of `token_ids`."""
    for index in range(len(keys), num_full_blocks):
        parent = keys[index - 1] if index else root_key(salt)
        keys.append(block_key(parent, token_ids[index * block_size:(index + 1) * block_size]))


def prefix_keys(token_ids: Sequence[int], block_size: int, salt: str | None = None,
                max_blocks: int | None = None) -> list[bytes]:
    """The keys of every full block of `token_ids` (at most `max_blocks` of them)."""
    num_full = len(token_ids) // block_size
    keys: list[bytes] = []
    extend_prefix_keys(keys, token_ids, block_size, num_full if max_blocks is None else min(num_full, max_blocks),
                       salt)
    return keys
