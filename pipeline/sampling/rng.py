"""Counter-based randomness (docs/design.md §5): one uniform per sampled token, from a stateless hash.

A token for choice `c` at output position `p` of a request with seed `s` is drawn with
u = uniforms(s, c, p). No generator state exists anywhere, so the number is the same whatever
else is in the batch, after a recompute preemption, and on another worker that resumes the
request. The hash is splitmix64's finalizer applied along the chain seed -> choice -> position,
in uint64 arithmetic that wraps (numpy integer arrays wrap silently; the scalar path can warn,
hence the errstate).
"""

from __future__ import annotations

import hashlib

import numpy as np

_UINT64_MASK = (1 << 64) - 1
_GOLDEN_GAMMA = np.uint64(0x9E3779B97F4A7C15)
_MIX_MULTIPLIER_1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX_MULTIPLIER_2 = np.uint64(0x94D049BB133111EB)
# Distinct odd constants per counter, so (seed, choice, position) = (a, b, c) and (a, c, b) differ.
_CHOICE_SALT = np.uint64(0xD6E8FEB86659FD93)
_POSITION_SALT = np.uint64(0xA0761D6478BD642F)
_STREAM_SALT = np.uint64(0xE7037ED1A0B428DB)
# Independent streams of uniforms for one (seed, choice, position): the token draw, and each
# sampler stage that flips a coin (XTC), so adding a coin never shifts the token draw.
SAMPLING_STREAM = 0
XTC_STREAM = 1
_TWO_POW_MINUS_53 = 2.0**-53
# 2**53 * u for the zero hash: half a step, keeps u strictly above 0.
_SMALLEST_UNIFORM = 2.0**-54
_SEED_PERSONALIZATION = b"aqueduct-seed-v1"  # blake2b domain separation (max 16 bytes)


def _mix(z: np.ndarray) -> np.ndarray:
    """splitmix64 finalizer: a bijection on uint64 with full avalanche."""
    z = z + _GOLDEN_GAMMA
    z = (z ^ (z >> np.uint64(30))) * _MIX_MULTIPLIER_1
    z = (z ^ (z >> np.uint64(27))) * _MIX_MULTIPLIER_2
    return z ^ (z >> np.uint64(31))


def _as_uint64(values: np.ndarray) -> np.ndarray:
    """Reinterpret int64 counters as uint64 two's complement (-1 -> 2**64 - 1), no value checks."""
    array = np.asarray(values)
    if array.dtype == np.uint64:
        return array
    return array.astype(np.int64).view(np.uint64)


def hash_counters(seeds: np.ndarray, choice_index: np.ndarray, output_position: np.ndarray,
                  stream: int = SAMPLING_STREAM) -> np.ndarray:
    """uint64 hash of the three counters (and the stream); arrays broadcast against each other.

    The sampling stream is the chain seed -> choice -> position; another stream mixes its number
    in as a fourth link, so stream 0 keeps the values it has always had."""
    seeds_u64 = _as_uint64(seeds)
    choice_u64 = _as_uint64(choice_index)
    position_u64 = _as_uint64(output_position)
    with np.errstate(over="ignore"):
        state = _mix(seeds_u64)
        state = _mix(state ^ (choice_u64 * _CHOICE_SALT))
        state = _mix(state ^ (position_u64 * _POSITION_SALT))
        if stream != SAMPLING_STREAM:
            state = _mix(state ^ (np.uint64(stream) * _STREAM_SALT))
        return state


def uniforms(seeds: np.ndarray, choice_index: np.ndarray, output_position: np.ndarray,
             stream: int = SAMPLING_STREAM) -> np.ndarray:
    """float64 uniforms in the open interval (0, 1) with 53 random bits, one per counter triple.

    The top 53 bits k of the hash give u = k / 2**53, an exact float64 in [0, 1); k = 0 maps to
    2**-54 so that u > 0 and the sampler's `cumsum > u * total` always skips zero-mass tokens.
    """
    bits = hash_counters(seeds, choice_index, output_position, stream) >> np.uint64(11)
    values = bits.astype(np.float64) * _TWO_POW_MINUS_53
    return np.where(bits == 0, _SMALLEST_UNIFORM, values)


def seed_from_request_id(request_id: str) -> int:
    """A 63-bit seed from a request id, equal on every process and machine (unlike hash())."""
    digest = hashlib.blake2b(
        request_id.encode("utf-8"), digest_size=8, person=_SEED_PERSONALIZATION
    ).digest()
    return int.from_bytes(digest, "little") >> 1


def request_seed(seed: int | None, request_id: str) -> int:
    """The uint64 seed of a request: its own `seed` (wrapped to 64 bits), else one from its id."""
    if seed is None:
        return seed_from_request_id(request_id)
    return seed & _UINT64_MASK
