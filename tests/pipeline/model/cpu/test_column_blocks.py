"""The native quantized kernels' column-block layouts (csrc/int4_linear.c, csrc/int8_linear.c): packing,
rows computed independently of each other, and the AVX-512, AVX2 and portable paths giving the same bits."""

from __future__ import annotations

import platform

import gguf
import numpy as np
import pytest
import torch

from pipeline.loading.gguf.quant_blocks import decode_q4
from pipeline.model.cpu import library as kernel_library
from pipeline.model.cpu.kernels import QuantizedLinearKernel, load_quantized_linear_kernel
from pipeline.model.layers.column_layout import (
    pack_block_scales,
    pack_column_blocks,
    pack_int8_blocks,
    unpack_block_scales,
    unpack_column_blocks,
    unpack_int8_blocks,
)
from pipeline.model.layers.quantized_linear import Int4Linear, Int8Linear

Q = gguf.GGMLQuantizationType


def _native() -> QuantizedLinearKernel:
    kernel = load_quantized_linear_kernel()
    if kernel is None:
        pytest.skip("no C compiler")
    return kernel


def _layer(out_features: int, in_features: int, seed: int, kernel: QuantizedLinearKernel,
           bits: int = 4) -> Int4Linear | Int8Linear:
    rng = np.random.default_rng(seed)
    weight = rng.standard_normal((out_features, in_features)).astype(np.float32)
    bias = torch.from_numpy(rng.standard_normal(out_features).astype(np.float32))
    if bits == 8:
        return Int8Linear.from_float(torch.from_numpy(weight), bias, kernel)
    return Int4Linear(*decode_q4(gguf.quants.quantize(weight, Q.Q4_1), "Q4_1"), bias, kernel)


def test_column_blocks_hold_each_value_where_the_layout_says_and_unpack():
    values = torch.randint(0, 16, (21, 64), generator=torch.Generator().manual_seed(0))  # 2 blocks, the last padded
    packed = pack_column_blocks(values)
    assert packed.shape == (2, 2 * 256) and packed.dtype == torch.uint8
    # Column 3's values 4 and 20 of group 0: chunk 2, byte 2 * 3 + 0 = 6 (module docstring's example).
    assert int(packed[0, 32 * 2 + 6]) == int(values[3, 4]) | int(values[3, 20]) << 4
    # Column 17 is block 1's column 1; its values 32 + 5 and 32 + 21 (group 1, chunk 2, h = 1).
    assert int(packed[1, 256 + 32 * 2 + 2 * 1 + 1]) == int(values[17, 37]) | int(values[17, 53]) << 4
    assert int(packed[1, 32 * 0 + 2 * 5]) == 0  # column 21 is padding
    assert torch.equal(unpack_column_blocks(packed, 21), values.to(torch.uint8))
    d, m = torch.randn(21, 2).half(), torch.randn(21, 2).half()
    scales = pack_block_scales(d, m)
    assert scales.shape == (2, 2, 2, 16) and float(scales[1, 0, 1, 4]) == float(m[20, 0])
    assert all(torch.equal(a, b) for a, b in zip(unpack_block_scales(scales, 21), (d, m), strict=True))


def test_int8_blocks_hold_each_value_where_the_layout_says_and_unpack():
    values = torch.randint(-127, 128, (21, 56), generator=torch.Generator().manual_seed(0), dtype=torch.int8)
    packed = pack_int8_blocks(values)  # 2 blocks (the last padded), 2 groups (the last padded)
    assert packed.shape == (2, 2 * 512) and packed.dtype == torch.int8
    assert int(packed[0, 512 + 32 * 3 + 10]) == int(values[5, 38])  # the module docstring's example
    assert int(packed[0, 512 + 32 * 3 + 11]) == int(values[5, 39])
    assert int(packed[1, 512 + 32 * 15 + 2 * 4 + 1]) == 0  # column 20, input 63: padding
    assert torch.equal(unpack_int8_blocks(packed, 21, 56), values)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_rows_result_is_the_same_bits_whatever_rows_share_the_call(dtype, bits):
    """What lets a verified draft position get the logits a one-row decode step gives."""
    layer = _layer(40, 96, seed=1, kernel=_native(), bits=bits)
    layer.many_rows_on_amx = False  # as a speculative engine's layers (ModelRunner's exact_rows)
    x = torch.randn(19, 96, generator=torch.Generator().manual_seed(2)).to(dtype)
    together = layer(x)
    for row in range(19):
        assert torch.equal(layer(x[row:row + 1]), together[row:row + 1])
    for rows in range(2, 11):
        assert torch.equal(layer(x[:rows]), together[:rows])
    gate_up = torch.randn(9, 192, generator=torch.Generator().manual_seed(3)).to(dtype)
    gated = layer.forward_gated(gate_up)
    assert all(torch.equal(layer.forward_gated(gate_up[row:row + 1]), gated[row:row + 1]) for row in range(9))


def _kernel_built_for(march: str) -> QuantizedLinearKernel | None:
    flags = [("-march=" + march if flag == "-march=native" else flag) for flag in kernel_library._POOL_FLAGS]
    library = kernel_library._load_library(f"int4_{march}", flags, ("thread_pool", "int8_linear", "int4_linear",
                                                                        "int4_amx"))
    return None if library is None else QuantizedLinearKernel(library)


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86 vector paths")
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("march", ["x86-64-v3", "x86-64"])  # AVX2 + FMA; no vector extensions (portable C)
def test_every_vector_path_gives_the_native_paths_bits(march, bits):
    """One order of operations in every path (integer dot products, then the same fused multiply-adds),
    so the AVX2 and portable builds give the bits of the build for this CPU (AVX-512 where it has it)."""
    native = _native()
    other = _kernel_built_for(march)
    if other is None:
        pytest.skip("no C compiler")
    layer = _layer(72, 128 if bits == 4 else 120, seed=4, kernel=native, bits=bits)
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(11, layer.in_features, generator=torch.Generator().manual_seed(5)).to(dtype)
        ours = layer(x)
        layer.native = other
        theirs = layer(x)
        layer.native = native
        assert torch.equal(ours, theirs)
    if bits == 4:
        dequantized = other.dequantize_int4(layer.column_blocks, layer.block_scales, 72, torch.float32)
    else:
        dequantized = other.dequantize_int8(layer.column_blocks, layer.scales, 72, 120, torch.float32)
    assert torch.equal(dequantized, layer.dequantized())
