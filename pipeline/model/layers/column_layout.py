"""The column-block layouts of the native 4-bit and int8 kernels (csrc/int4_linear.c, csrc/int8_linear.c;
csrc/gguf_columns.c and csrc/int4_amx.c read the 4-bit one too): output columns in blocks of 16, one
column per vector lane, inputs in groups of 32. Packing writes a layer's values and scales into them
once at load; unpacking is the inverse, for dequantization and tests.
"""

from __future__ import annotations

import torch

GROUP_SIZE = 32  # GGUF's Q4_0/Q4_1/Q8_0 block length
BLOCK_COLUMNS = 16  # output columns side by side in the native 4-bit layout (csrc/int4_linear.c)
_CHUNKS, _BLOCK_GROUP_BYTES = 8, 256  # 4-bit, per block and group: 8 chunks of 32 bytes
_INT8_BLOCK_GROUP_BYTES = 512  # int8, per block and group: 16 chunks of 32 bytes


def pack_int8_blocks(values: torch.Tensor) -> torch.Tensor:
    """int8 [N, K] -> [ceil(N / 16), ceil(K / 32) * 512] int8, csrc/int8_linear.c's layout: columns in
    blocks of 16 and inputs to a multiple of 32, padded with zeros; per block and group of 32 inputs
    sixteen chunks of 32 bytes, chunk i's byte 2 c + h holding column c's value 2 i + h. Worked
    example: column 5's values 32 + 6 and 32 + 7 -> group 1, chunk 3, bytes 10 and 11."""
    columns, inputs = values.shape
    blocks, groups = -(-columns // BLOCK_COLUMNS), -(-inputs // GROUP_SIZE)
    padded = torch.zeros(blocks * BLOCK_COLUMNS, groups * GROUP_SIZE, dtype=torch.int8)
    padded[:columns, :inputs] = values
    # [block, column, group, chunk, h] -> [block, group, chunk, column, h]
    split = padded.view(blocks, BLOCK_COLUMNS, groups, GROUP_SIZE // 2, 2).permute(0, 2, 3, 1, 4)
    return split.reshape(blocks, groups * _INT8_BLOCK_GROUP_BYTES).contiguous()


def unpack_int8_blocks(column_blocks: torch.Tensor, columns: int, inputs: int) -> torch.Tensor:
    """pack_int8_blocks' inverse: -> int8 [columns, inputs]."""
    blocks, groups = column_blocks.shape[0], column_blocks.shape[1] // _INT8_BLOCK_GROUP_BYTES
    split = column_blocks.view(blocks, groups, GROUP_SIZE // 2, BLOCK_COLUMNS, 2).permute(0, 3, 1, 2, 4)
    return split.reshape(blocks * BLOCK_COLUMNS, groups * GROUP_SIZE)[:columns, :inputs]


def pack_column_blocks(values: torch.Tensor) -> torch.Tensor:
    """values [N, K] in 0..15 -> [ceil(N / 16), K * 8] uint8, csrc/int4_linear.c's layout: columns in
    blocks of 16 (the last padded with zeros), per block and group of 32 inputs eight chunks of 32
    bytes, chunk i's byte 2 c + h holding column c's value 2 i + h (low half) and 2 i + h + 16 (high
    half). Worked example: column 3's values 4 and 20 of group 0 -> chunk 2, byte 6 = v4 | v20 << 4."""
    columns, inputs = values.shape
    blocks, groups = -(-columns // BLOCK_COLUMNS), inputs // GROUP_SIZE
    padded = torch.zeros(blocks * BLOCK_COLUMNS, inputs, dtype=torch.uint8)
    padded[:columns] = values.to(torch.uint8)
    # [block, column, group, half (low/high), chunk, h] -> [block, group, chunk, column, h, half]
    split = padded.view(blocks, BLOCK_COLUMNS, groups, 2, _CHUNKS, 2).permute(0, 2, 4, 1, 5, 3)
    return (split[..., 0] | (split[..., 1] << 4)).reshape(blocks, groups * _BLOCK_GROUP_BYTES).contiguous()


def unpack_column_blocks(column_blocks: torch.Tensor, columns: int) -> torch.Tensor:
    """pack_column_blocks' inverse: -> [columns, K] values 0..15."""
    blocks, groups = column_blocks.shape[0], column_blocks.shape[1] // _BLOCK_GROUP_BYTES
    split = column_blocks.view(blocks, groups, _CHUNKS, BLOCK_COLUMNS, 2)
    halves = torch.stack([split & 0x0F, split >> 4], dim=-1)  # [block, group, chunk, column, h, half]
    values = halves.permute(0, 3, 1, 5, 2, 4).reshape(blocks * BLOCK_COLUMNS, groups * GROUP_SIZE)
    return values[:columns]


def pack_block_scales(scales: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """d and m [N, G] float16 -> [ceil(N / 16), G, 2, 16]: per block and group its 16 columns' d, then
    their m (the last block padded with zeros)."""
    columns, groups = scales.shape
    blocks = -(-columns // BLOCK_COLUMNS)
    padded = torch.zeros(2, blocks * BLOCK_COLUMNS, groups, dtype=torch.float16)
    padded[0, :columns], padded[1, :columns] = scales, offsets
    return padded.view(2, blocks, BLOCK_COLUMNS, groups).permute(1, 3, 0, 2).contiguous()


def unpack_block_scales(block_scales: torch.Tensor, columns: int) -> tuple[torch.Tensor, torch.Tensor]:
    """pack_block_scales' inverse: (d, m), each [columns, G] float16."""
    blocks, groups = block_scales.shape[:2]
    both = block_scales.permute(2, 0, 3, 1).reshape(2, blocks * BLOCK_COLUMNS, groups)
    return both[0, :columns], both[1, :columns]
