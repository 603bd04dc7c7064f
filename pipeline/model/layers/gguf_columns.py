"""GGUF rows of Q5_0, Q8_0, Q4_K, Q5_K and Q6_K re-laid into column blocks for csrc/gguf_columns.c's
integer kernel (its header comment has the layout): each weight's integer q and its block's scales
are the file's, only their order changes, so the layer holds about the file's bytes (Q4_K: 148 for
the file's 144 a super-block, its 6-bit scales held as bytes; the others the same) and dequantizes to
gguf-py's values bit for bit.

`unpack(qtype, rows, in_features)` reads the file's blocks into q [O, I] and their scales;
`pack(...)` writes the column blocks. Worked example (Q5_0, one block of 32): d = 0.5, qh = 0x00080000,
qs[3] = 0x5A -> q[3] = 0xA = 10 (bit 3 of qh clear), q[19] = 0x5 | 1 << 4 = 21; w[19] = 0.5 * (21 - 16).
"""

from __future__ import annotations

import numpy as np
import torch

from pipeline.model.layers.column_layout import BLOCK_COLUMNS
from pipeline.model.layers.column_layout import GROUP_SIZE as GROUP

COLUMN_TYPES = ("Q5_0", "Q8_0", "Q4_K", "Q5_K", "Q6_K")
SUPER = 256
_HIGH_BITS = {"Q5_0": 1, "Q8_0": 0, "Q4_K": 0, "Q5_K": 1, "Q6_K": 2}
_INPUTS_PER_BLOCK = {"Q5_0": GROUP, "Q8_0": GROUP, "Q4_K": SUPER, "Q5_K": SUPER, "Q6_K": SUPER}
_BLOCK_BYTES = {"Q5_0": 22, "Q8_0": 34, "Q4_K": 144, "Q5_K": 176, "Q6_K": 210}


def fits(qtype: str, in_features: int) -> bool:
    return qtype in COLUMN_TYPES and in_features % _INPUTS_PER_BLOCK[qtype] == 0


def _halves(blocks: np.ndarray, at: int) -> np.ndarray:
    """The float16 at byte `at` of each block, as its raw uint16 bits: [O, blocks]."""
    return np.ascontiguousarray(blocks[..., at:at + 2]).view(np.uint16)[..., 0]


def _k_scales(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K's 12 scale bytes -> (sc, m) [..., 8] (csrc/gguf_blocks.h has the bit layout)."""
    s = scales.astype(np.uint8)
    sc = np.concatenate([s[..., 0:4] & 63, (s[..., 8:12] & 0x0F) | (s[..., 0:4] >> 6) << 4], axis=-1)
    m = np.concatenate([s[..., 4:8] & 63, (s[..., 8:12] >> 4) | (s[..., 4:8] >> 6) << 4], axis=-1)
    return sc, m


def unpack(qtype: str, rows: np.ndarray, in_features: int) -> dict[str, np.ndarray]:
    """The file's rows (uint8 [O, bytes]) as q [O, I] (uint8, Q8_0 int8) and scales: "d" [O, groups or
    supers] float16 bits; K-quants also "dmin" bits and "sc", "m" per group of 32 (Q6_K: "sc" int8
    per 16)."""
    count = rows.shape[0]
    blocks = rows.reshape(count, -1, _BLOCK_BYTES[qtype])
    if qtype == "Q8_0":
        return {"q": blocks[..., 2:].view(np.int8).reshape(count, in_features), "d": _halves(blocks, 0)}
    if qtype == "Q5_0":
        qh = np.ascontiguousarray(blocks[..., 2:6]).view("<u4")  # [O, n, 1]
        qs = blocks[..., 6:22]
        bits = (qh >> np.arange(32, dtype=np.uint32)) & 1
        q = np.concatenate([qs & 0x0F, qs >> 4], axis=-1) | (bits.astype(np.uint8) << 4)
        return {"q": q.reshape(count, in_features), "d": _halves(blocks, 0)}
    if qtype in ("Q4_K", "Q5_K"):
        sc, m = _k_scales(blocks[..., 4:16])
        qs = blocks[..., 16:144] if qtype == "Q4_K" else blocks[..., 48:176]
        runs = qs.reshape(count, -1, 4, 32)
        q = np.stack([runs & 0x0F, runs >> 4], axis=3)  # [O, n, run r, sub-block 2 r + h, 32]
        if qtype == "Q5_K":
            qh = blocks[..., 16:48][:, :, None, None, :]
            shifts = np.arange(8, dtype=np.uint8).reshape(4, 2)[None, None, :, :, None]
            q = q | (((qh >> shifts) & 1) << 4)
        return {"q": q.reshape(count, in_features), "d": _halves(blocks, 0), "dmin": _halves(blocks, 2),
                "sc": sc.reshape(count, -1), "m": m.reshape(count, -1)}
    if qtype == "Q6_K":
        ql, qh = blocks[..., 0:128].reshape(count, -1, 2, 2, 32), blocks[..., 128:192].reshape(count, -1, 2, 1, 32)
        low = np.stack([ql[:, :, :, 0] & 0x0F, ql[:, :, :, 1] & 0x0F, ql[:, :, :, 0] >> 4, ql[:, :, :, 1] >> 4], axis=3)
        shifts = (2 * np.arange(4, dtype=np.uint8))[None, None, None, :, None]
        q = low | (((qh >> shifts) & 3) << 4)  # [O, n, half, r, 32]
        sc = blocks[..., 192:208].view(np.int8)
        return {"q": q.reshape(count, in_features), "d": _halves(blocks, 208), "sc": sc.reshape(count, -1)}
    raise ValueError(f"no column-block layout for {qtype}")


def _padded(array: np.ndarray) -> np.ndarray:
    """Rows padded with zeros to a whole number of 16-column blocks."""
    extra = -array.shape[0] % BLOCK_COLUMNS
    return np.concatenate([array, np.zeros((extra, *array.shape[1:]), array.dtype)]) if extra else array


def _by_block(per_row: np.ndarray) -> np.ndarray:
    """[O, n] (or [O, n, k]) per row -> [blocks, n, (k,) 16]: each block's 16 columns side by side."""
    padded = _padded(per_row)
    shaped = padded.reshape(-1, BLOCK_COLUMNS, *padded.shape[1:])
    return np.ascontiguousarray(np.moveaxis(shaped, 1, -1))


def _value_chunks(q: np.ndarray, qtype: str) -> np.ndarray:
    """q [Opad, groups, 32] -> [blocks, groups, bytes]: chunk i's byte 2 c + h is column c's q[2 i + h]
    (Q8_0), or its low 4 bits with q[2 i + h + 16]'s in the high half."""
    blocks, groups = q.shape[0] // BLOCK_COLUMNS, q.shape[1]
    if qtype == "Q8_0":
        pairs = q.reshape(blocks, BLOCK_COLUMNS, groups, 16, 2)  # [b, c, g, i, h]
        return np.ascontiguousarray(pairs.transpose(0, 2, 3, 1, 4)).view(np.uint8).reshape(blocks, groups, 512)
    nibbles = q & 0x0F
    byte = nibbles[..., :16] | nibbles[..., 16:] << 4  # [Opad, g, 2 i + h]
    pairs = byte.reshape(blocks, BLOCK_COLUMNS, groups, 8, 2)
    return np.ascontiguousarray(pairs.transpose(0, 2, 3, 1, 4)).reshape(blocks, groups, 256)


def _high_masks(q: np.ndarray, bits: int) -> np.ndarray:
    """q's bits 4 (and 5) as masks: per chunk i, bit b and half, bit 2 c + h set when column c's
    q[2 i + h + 16 half] has it -> [blocks, groups, 8 * bits * 2 * 4] bytes."""
    blocks, groups = q.shape[0] // BLOCK_COLUMNS, q.shape[1]
    planes = np.stack([(q >> (4 + bit)) & 1 for bit in range(bits)])  # [bit, Opad, g, 32]
    shaped = planes.reshape(bits, blocks, BLOCK_COLUMNS, groups, 2, 8, 2)  # [bit, b, c, g, half, i, h]
    ordered = shaped.transpose(1, 3, 5, 0, 4, 2, 6)  # [b, g, i, bit, half, c, h]
    packed = np.packbits(ordered.reshape(blocks, groups, -1, 32).astype(np.uint8), axis=-1, bitorder="little")
    return np.ascontiguousarray(packed).reshape(blocks, groups, -1)


def pack(qtype: str, rows: np.ndarray, in_features: int) -> dict[str, torch.Tensor]:
    """The file's rows of `qtype` -> the column-block buffers, each [blocks, ...] so that a slice of
    blocks is a slice of rows: "values", "high" (5- and 6-bit types), "halves", "bytes" (K-quants)."""
    parts = unpack(qtype, np.asarray(rows), in_features)
    q = _padded(parts["q"]).reshape(-1, in_features // GROUP, GROUP)
    out = {"values": _value_chunks(q, qtype)}
    if _HIGH_BITS[qtype]:
        out["high"] = _high_masks(q.astype(np.uint8), _HIGH_BITS[qtype])
    if qtype in ("Q5_0", "Q8_0"):
        out["halves"] = _by_block(parts["d"])
    elif qtype == "Q6_K":
        out["halves"] = _by_block(parts["d"])
        out["bytes"] = _by_block(parts["sc"].reshape(rows.shape[0], -1, 2)).view(np.uint8)
    else:
        out["halves"] = _by_block(np.stack([parts["d"], parts["dmin"]], axis=-1))
        out["bytes"] = _by_block(np.stack([parts["sc"], parts["m"]], axis=-1))
    blocks = out["values"].shape[0]
    return {name: torch.from_numpy(np.ascontiguousarray(array).reshape(blocks, -1).view(np.uint8))
            for name, array in out.items()}
