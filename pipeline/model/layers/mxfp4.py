"""MXFP4 (OCP microscaling FP4) dequantization, for checkpoints that store weights that way (gpt-oss's experts).

A tensor is stored as `*_blocks` [..., G, 16] uint8 and `*_scales` [..., G] uint8: each block of 32
values shares the exponent scale - 127, and each byte holds two FP4 (e2m1) codes, the low nibble
first. value = FP4_VALUES[code] * 2 ** (scale - 127).
"""

from __future__ import annotations

import torch

# e2m1 codes 0..15: sign bit 3, then 0, 0.5, 1, 1.5, 2, 3, 4, 6.
FP4_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
_SCALE_BIAS = 127


def dequantize_mxfp4(blocks: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """blocks [..., G, B] uint8, scales [..., G] uint8 -> [..., G * 2B] in `dtype`.

    blocks [[0x21]] (codes 1 then 2), scales [128] -> [0.5 * 2, 1.0 * 2] = [1.0, 2.0]
    """
    if blocks.dtype != torch.uint8 or scales.dtype != torch.uint8:
        raise ValueError(f"MXFP4 blocks and scales must be uint8, got {blocks.dtype} and {scales.dtype}")
    if blocks.shape[:-1] != scales.shape:
        raise ValueError(f"MXFP4 blocks {tuple(blocks.shape)} do not match scales {tuple(scales.shape)}")
    if blocks.dim() > 3:  # one expert (leading index) at a time: the index temporaries stay a matrix's size
        return torch.stack([dequantize_mxfp4(blocks[index], scales[index], dtype) for index in range(blocks.shape[0])])
    lut = torch.tensor(FP4_VALUES, dtype=dtype, device=blocks.device)
    low, high = lut[(blocks & 0x0F).long()], lut[(blocks >> 4).long()]
    values = torch.stack([low, high], dim=-1).flatten(-2)  # [..., G, 2B]: low nibble first
    exponents = scales.to(torch.int32) - _SCALE_BIAS
    return torch.ldexp(values, exponents.unsqueeze(-1)).flatten(-2)
