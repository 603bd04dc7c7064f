"""GGUF blocks for tests: a simple quantizer for the K-quants gguf-py cannot write (Q4_K, Q5_K, Q6_K),
and random valid blocks of any type the GGUF kernel reads.

The quantizer is not llama.cpp's (no search for the best scales): it picks each sub-block's scale
and min from its range, then rounds. What matters for the tests is that the blocks are valid and
near the weights they came from, so a model written with them behaves like its float original;
its layouts are written here independently of pipeline/model/cpu/csrc/gguf_blocks.h, and
gguf.quants.dequantize is what both are held to.
"""

from __future__ import annotations

import gguf
import numpy as np

Q = gguf.GGMLQuantizationType
_SUPER = 256  # weights per K-quant block


def quantize(array: np.ndarray, qtype: Q) -> np.ndarray:
    """float32 [rows, K] -> raw blocks uint8 [rows, K / block weights * block bytes]."""
    if qtype in (Q.Q4_K, Q.Q5_K, Q.Q6_K):
        rows = array.shape[0]
        blocks = np.asarray(array, dtype=np.float32).reshape(-1, _SUPER)
        pack = {Q.Q4_K: _q4_k, Q.Q5_K: _q5_k, Q.Q6_K: _q6_k}[qtype]
        return pack(blocks).reshape(rows, -1)
    return gguf.quants.quantize(np.asarray(array, dtype=np.float32), qtype)


def random_blocks(qtype: Q, rows: int, in_features: int, rng: np.random.Generator) -> np.ndarray:
    """Random bytes [rows, bytes per row] with each float16 scale finite: every bit pattern of the
    other fields is valid, so random bytes reach every nibble, high bit and 6-bit scale packing."""
    weights, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(rows, in_features // weights, block_bytes), dtype=np.uint8)
    offsets = {Q.Q4_1: (0, 2), Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208,)}.get(qtype, (0,))
    for offset in offsets:
        halves = (rng.standard_normal(raw.shape[:2]) * 0.02).astype(np.float16)
        raw[..., offset:offset + 2] = halves.view(np.uint8).reshape(*raw.shape[:2], 2)
    return raw.reshape(rows, -1)


def _half(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(float16 bytes [n, 2], the float32 value they hold)."""
    halves = values.astype(np.float16)
    return halves.reshape(-1, 1).view(np.uint8), halves.astype(np.float32)


def _divide(values: np.ndarray, by: np.ndarray) -> np.ndarray:
    return np.divide(values, by, out=np.zeros_like(values), where=by != 0)


def _scales_and_mins(blocks: np.ndarray, levels: int) -> tuple[np.ndarray, ...]:
    """Q4_K/Q5_K: per sub-block of 32, w ~ (d * sc) * q - dmin * m with q in 0..levels."""
    sub = blocks.reshape(-1, 8, 32)
    low = np.minimum(sub.min(axis=-1), 0.0)
    scale, mins = (sub.max(axis=-1) - low) / levels, -low
    d_bytes, d = _half(scale.max(axis=-1) / 63)
    dmin_bytes, dmin = _half(mins.max(axis=-1) / 63)
    sc = np.clip(np.rint(_divide(scale, d[:, None])), 0, 63).astype(np.uint8)
    m = np.clip(np.rint(_divide(mins, dmin[:, None])), 0, 63).astype(np.uint8)
    step, offset = d[:, None] * sc, dmin[:, None] * m
    q = np.clip(np.rint(_divide(sub + offset[..., None], step[..., None])), 0, levels).astype(np.uint8)
    packed = np.concatenate([
        (sc[:, :4] & 63) | ((sc[:, 4:] >> 4) << 6),
        (m[:, :4] & 63) | ((m[:, 4:] >> 4) << 6),
        (sc[:, 4:] & 0x0F) | ((m[:, 4:] & 0x0F) << 4),
    ], axis=1)
    return d_bytes, dmin_bytes, packed, q  # q [n, 8, 32]


def _nibbles(q: np.ndarray) -> np.ndarray:
    """Sub-blocks 2 r (low nibbles) and 2 r + 1 (high) share run r's 32 bytes: -> [n, 128]."""
    return ((q[:, 0::2] & 0x0F) | ((q[:, 1::2] & 0x0F) << 4)).reshape(-1, 128)


def _q4_k(blocks: np.ndarray) -> np.ndarray:
    d, dmin, scales, q = _scales_and_mins(blocks, 15)
    return np.concatenate([d, dmin, scales, _nibbles(q)], axis=1)


def _q5_k(blocks: np.ndarray) -> np.ndarray:
    d, dmin, scales, q = _scales_and_mins(blocks, 31)
    high_bits = np.zeros((q.shape[0], 32), dtype=np.uint8)
    for sub in range(8):  # sub-block i's fifth bits are bit i of qh[0..31]
        high_bits |= ((q[:, sub] >> 4) & 1) << sub
    return np.concatenate([d, dmin, scales, high_bits, _nibbles(q)], axis=1)


def _q6_k(blocks: np.ndarray) -> np.ndarray:
    sub = blocks.reshape(-1, 16, 16)
    scale = np.take_along_axis(sub, np.abs(sub).argmax(axis=-1)[..., None], axis=-1)[..., 0] / -32
    d_bytes, d = _half(np.abs(scale).max(axis=-1) / 127)
    sc = np.clip(np.rint(_divide(scale, d[:, None])), -128, 127).astype(np.int8)
    step = d[:, None] * sc
    q = (np.clip(np.rint(_divide(sub, step[..., None])), -32, 31) + 32).astype(np.uint8).reshape(-1, 2, 4, 32)
    low, high = np.zeros((q.shape[0], 2, 64), np.uint8), np.zeros((q.shape[0], 2, 32), np.uint8)
    for r in range(4):  # weight 128 h + 32 r + l: ql[64 h + 32 (r & 1) + l], nibble r >> 1; qh[32 h + l], bits 2 r
        low[:, :, 32 * (r & 1):32 * (r & 1) + 32] |= (q[:, :, r] & 0x0F) << (4 * (r >> 1))
        high |= (q[:, :, r] >> 4) << (2 * r)
    return np.concatenate([low.reshape(-1, 128), high.reshape(-1, 64), sc.view(np.uint8), d_bytes], axis=1)
