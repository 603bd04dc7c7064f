import numpy as np
import pytest

from pipeline.speculative.ngram import propose_draft


def _reference(tokens: list[int], k: int, min_n: int, max_n: int) -> list[int]:
    """Brute force: for n from max_n down to min_n, the latest earlier occurrence of the last n tokens."""
    length = len(tokens)
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        suffix = tokens[length - n:]
        for start in range(length - n - 1, -1, -1):
            if tokens[start:start + n] == suffix:
                return tokens[start + n:start + n + k]
    return []


def test_copies_what_followed_the_longest_latest_match():
    assert propose_draft(np.array([4, 5, 6, 9, 4, 5, 6]), 2, 1, 3) == [9, 4]
    # [5, 6] also follows 7 at index 4, but the 3-gram [4, 5, 6] only matches at the start
    assert propose_draft(np.array([4, 5, 6, 1, 7, 5, 6, 2, 4, 5, 6]), 3, 1, 3) == [1, 7, 5]
    assert propose_draft(np.array([4, 5, 6, 1, 7, 5, 6, 2, 4, 5, 6]), 3, 1, 2) == [2, 4, 5]


def test_no_draft_below_min_n_or_without_a_match():
    assert propose_draft(np.array([1, 2, 3, 4]), 3, 1, 3) == []
    assert propose_draft(np.array([1, 2, 9, 2]), 3, 2, 3) == []  # only a 1-gram matches
    assert propose_draft(np.array([7]), 3, 1, 3) == []
    assert propose_draft(np.array([7, 7, 7]), 0, 1, 3) == []


def test_draft_stops_at_the_end_of_the_context():
    # [8, 8] last occurred at 1..2 (overlapping the suffix), followed only by the last token
    assert propose_draft(np.array([8, 8, 8, 8]), 5, 1, 2) == [8]


@pytest.mark.parametrize("seed", range(40))
def test_matches_brute_force(seed):
    rng = np.random.default_rng(seed)
    length = int(rng.integers(1, 60))
    tokens = rng.integers(0, int(rng.integers(2, 8)), length).tolist()
    k, min_n = int(rng.integers(1, 6)), int(rng.integers(1, 4))
    max_n = min_n + int(rng.integers(0, 4))
    assert propose_draft(np.array(tokens), k, min_n, max_n) == _reference(tokens, k, min_n, max_n)
