"""Prefill groups (groups.prefill_groups): a prompt's long first chunk alone, the rest padded together."""

from __future__ import annotations

import numpy as np

from pipeline.model.attention.groups import ALONE_MIN_TOKENS, prefill_groups


def test_long_first_chunks_go_alone_and_the_rest_share_groups() -> None:
    long, short = ALONE_MIN_TOKENS + 8, ALONE_MIN_TOKENS - 1
    # first chunks: long (alone), short (grouped); a long chunk after a context (grouped)
    query_lens = np.array([long, short, long])
    seq_lens = np.array([long, short, long + 50])
    groups = [group.tolist() for group in prefill_groups(query_lens, seq_lens)]
    assert groups[0] == [0]
    assert sorted(seq for group in groups[1:] for seq in group) == [1, 2]


def test_groups_cover_every_sequence_once() -> None:
    rng = np.random.default_rng(0)
    query_lens = rng.integers(2, 200, 40)
    seq_lens = query_lens + rng.integers(0, 2, 40) * rng.integers(1, 300, 40)
    groups = prefill_groups(query_lens, seq_lens)
    assert sorted(np.concatenate(groups).tolist()) == list(range(40))
    alone = {int(group[0]) for group in groups if len(group) == 1}
    assert all(seq in alone for seq in np.flatnonzero((query_lens == seq_lens) & (query_lens >= ALONE_MIN_TOKENS)))


def test_a_short_chunk_is_not_padded_to_a_long_chunk_over_a_long_context() -> None:
    # A 1,024-token chunk over 4,096 keys and a 200-token one over 400: within 2x of the real work
    # together, but the short one would pay ~3.8M padded scores a head.
    groups = [group.tolist() for group in prefill_groups(np.array([1024, 200]), np.array([4096, 400]))]
    assert sorted(groups) == [[0], [1]]


def test_many_tiny_prompts_still_share_one_padded_group() -> None:
    query_lens = np.random.default_rng(1).integers(8, 17, 64)  # first chunks under ALONE_MIN_TOKENS
    groups = prefill_groups(query_lens, query_lens.copy())
    assert len(groups) == 1 and len(groups[0]) == 64
