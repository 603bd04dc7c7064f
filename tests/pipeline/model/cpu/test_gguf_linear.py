"""csrc/gguf_linear.c: GGUF blocks decoded as gguf-py decodes them, multiplied as the dequantized weight
is, and a row's result the same bits whatever other rows share the call."""

from __future__ import annotations

import platform

import gguf
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from pipeline.model.cpu import library as kernel_library
from pipeline.model.cpu.gguf_kernel import GgufLinearKernel, load_gguf_linear_kernel, segment_array
from pipeline.model.layers.gguf_linear import GgufLinear
from tests.support.kquant_blocks import quantize, random_blocks

Q = gguf.GGMLQuantizationType
KERNEL = load_gguf_linear_kernel()
pytestmark = pytest.mark.skipif(KERNEL is None, reason="no C compiler for the native kernels")

TYPES = [Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q8_0, Q.Q4_K, Q.Q5_K, Q.Q6_K]
ROW_COUNTS = (1, 2, 5, 32)


def _blocks(qtype: Q, rows: int, in_features: int, seed: int, random: bool) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    if random:
        return torch.from_numpy(random_blocks(qtype, rows, in_features, rng))
    weight = (rng.standard_normal((rows, in_features)) * in_features ** -0.5).astype(np.float32)
    return torch.from_numpy(quantize(weight, qtype))


def _reference(raw: torch.Tensor, qtype: Q) -> np.ndarray:
    return gguf.quants.dequantize(raw.numpy(), qtype)


@pytest.mark.parametrize("random", [False, True], ids=["quantized", "random-bytes"])
@pytest.mark.parametrize("qtype", TYPES, ids=lambda qtype: qtype.name)
def test_decoding_equals_gguf_py_bit_for_bit(qtype, random):
    raw = _blocks(qtype, 24, 512, seed=1, random=random)
    segments = segment_array([(int(qtype), raw)])
    reference = _reference(raw, qtype)
    for portable in (False, True):  # this CPU's vector decoders, and the plain C ones
        ours = KERNEL.dequantize(segments, torch.empty(24, 512), portable=portable).numpy()
        assert np.array_equal(ours.view(np.uint32), reference.view(np.uint32)), (qtype.name, portable)


@pytest.mark.parametrize("qtype", TYPES, ids=lambda qtype: qtype.name)
def test_bfloat16_dequantization_rounds_the_float32_values(qtype):
    raw = _blocks(qtype, 8, 256, seed=2, random=True)
    segments = segment_array([(int(qtype), raw)])
    ours = KERNEL.dequantize(segments, torch.empty(8, 256, dtype=torch.bfloat16))
    assert torch.equal(ours, torch.from_numpy(_reference(raw, qtype)).to(torch.bfloat16))


@pytest.mark.parametrize("qtype", TYPES, ids=lambda qtype: qtype.name)
def test_product_is_the_dequantized_weights_product_and_independent_of_row_count(qtype):
    # 800 = 12 * 64 + 32: the last two chunks of 16 go to chains 0 and 1 alone (csrc/gguf_linear.c)
    in_features = 768 if gguf.GGML_QUANT_SIZES[qtype][0] == 256 else 800
    raw = _blocks(qtype, 40, in_features, seed=3, random=False)
    weight = torch.from_numpy(_reference(raw, qtype))
    segments = segment_array([(int(qtype), raw)])
    bias = torch.randn(40, generator=torch.Generator().manual_seed(4))
    x = torch.randn(max(ROW_COUNTS), in_features, generator=torch.Generator().manual_seed(5))
    full = KERNEL(x, segments, 40, in_features, bias)
    expected = x.double() @ weight.double().T + bias.double()
    torch.testing.assert_close(full.double(), expected, rtol=1e-5, atol=1e-5)
    for rows in ROW_COUNTS:
        assert torch.equal(KERNEL(x[:rows], segments, 40, in_features, bias), full[:rows]), rows
        assert torch.equal(KERNEL(x[rows - 1:rows], segments, 40, in_features, bias), full[rows - 1:rows]), rows


def test_bfloat16_inputs_round_the_float32_product():
    raw = _blocks(Q.Q4_K, 48, 512, seed=6, random=False)
    segments = segment_array([(int(Q.Q4_K), raw)])
    x = torch.randn(32, 512, generator=torch.Generator().manual_seed(7)).to(torch.bfloat16)
    as_float = KERNEL(x.float(), segments, 48, 512, None)
    assert torch.equal(KERNEL(x, segments, 48, 512, None), as_float.to(torch.bfloat16))
    assert torch.equal(KERNEL(x, segments, 48, 512, None, float32_out=True), as_float.to(torch.bfloat16).float())
    for rows in ROW_COUNTS:
        assert torch.equal(KERNEL(x[:rows], segments, 48, 512, None), KERNEL(x, segments, 48, 512, None)[:rows])


def test_gated_input_is_silu_gate_times_up():
    raw = _blocks(Q.Q6_K, 32, 256, seed=8, random=False)
    segments = segment_array([(int(Q.Q6_K), raw)])
    gate_up = torch.randn(5, 512, generator=torch.Generator().manual_seed(9))
    gate, up = gate_up.chunk(2, dim=-1)
    ours = KERNEL(gate_up, segments, 32, 256, None, gated=True)
    torch.testing.assert_close(ours, KERNEL((F.silu(gate) * up).contiguous(), segments, 32, 256, None),
                               rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("sizes", [(64, 32, 32), (2, 1, 5)], ids=["qkv", "groups-straddling-segments"])
def test_segments_of_different_types_make_one_weight(sizes):
    """A Q4_K_M qkv_proj: q and k rows Q4_K, v rows Q6_K; and segments shorter than the four weight rows
    one x row takes at a time."""
    types = (Q.Q4_K, Q.Q6_K, Q.Q4_K) if sizes == (2, 1, 5) else (Q.Q4_K, Q.Q4_K, Q.Q6_K)
    parts = [(qtype, _blocks(qtype, rows, 256, 10 + i, False))
             for i, (qtype, rows) in enumerate(zip(types, sizes, strict=True))]
    segments = segment_array([(int(qtype), raw) for qtype, raw in parts])
    weight = torch.cat([torch.from_numpy(_reference(raw, qtype)) for qtype, raw in parts])
    x = torch.randn(5, 256, generator=torch.Generator().manual_seed(13))
    assert torch.equal(KERNEL.dequantize(segments, torch.empty(sum(sizes), 256)), weight)
    together = KERNEL(x, segments, sum(sizes), 256, None)
    torch.testing.assert_close(together.double(), x.double() @ weight.double().T, rtol=1e-5, atol=1e-5)
    for row in range(5):
        assert torch.equal(KERNEL(x[row:row + 1], segments, sum(sizes), 256, None), together[row:row + 1])


def _kernel_built_for(march: str) -> GgufLinearKernel | None:
    flags = [("-march=" + march if flag == "-march=native" else flag) for flag in kernel_library._POOL_FLAGS]
    library = kernel_library._load_library(f"gguf_{march}", flags, ("thread_pool", "gguf_linear"))
    return None if library is None else GgufLinearKernel(library)


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86 vector paths")
@pytest.mark.parametrize("march", ["x86-64-v3", "x86-64"])  # AVX2 + FMA; no vector extensions (portable C)
def test_every_vector_path_gives_the_native_paths_bits(march):
    """One order of operations in every build (and in the one-row path that decodes into registers),
    so the AVX2 and portable builds give the bits of the build for this CPU."""
    other = _kernel_built_for(march)
    if other is None:
        pytest.skip("no C compiler")
    for qtype in TYPES:
        in_features = 768 if gguf.GGML_QUANT_SIZES[qtype][0] == 256 else 800
        raw = _blocks(qtype, 20, in_features, seed=19, random=True)
        segments = segment_array([(int(qtype), raw)])
        for dtype in (torch.float32, torch.bfloat16):
            for rows in (1, 2, 5):
                x = torch.randn(rows, in_features, generator=torch.Generator().manual_seed(rows)).to(dtype)
                assert torch.equal(KERNEL(x, segments, 20, in_features, None),
                                   other(x, segments, 20, in_features, None)), (qtype.name, dtype, rows)
        assert torch.equal(other.dequantize(segments, torch.empty(20, in_features)),
                           KERNEL.dequantize(segments, torch.empty(20, in_features)))


def test_an_unknown_type_or_a_partial_block_is_a_clear_error():
    raw = _blocks(Q.Q8_0, 4, 256, 14, False)
    with pytest.raises(ValueError, match="unknown type"):
        KERNEL(torch.randn(1, 256), segment_array([(int(Q.Q2_K), raw)]), 4, 256, None)
    with pytest.raises(ValueError, match="not a whole number of blocks"):
        KERNEL(torch.randn(1, 128), segment_array([(int(Q.Q4_K), raw)]), 4, 128, None)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_layer_takes_the_kernel_for_few_rows_and_the_dequantized_weight_for_many(dtype):
    parts = [("Q4_K", _blocks(Q.Q4_K, 48, 512, 15, False)), ("Q6_K", _blocks(Q.Q6_K, 16, 512, 16, False))]
    bias = torch.randn(64, generator=torch.Generator().manual_seed(17))
    layer = GgufLinear(parts, 512, bias, KERNEL)
    weight = layer.dequantized()
    file_bytes = sum(raw.numel() for _, raw in parts)  # column blocks hold Q4_K's 6-bit scales as bytes
    assert file_bytes <= layer.resident_bytes() <= 1.03 * file_bytes
    many_rows = min(layer.dequantize_min_rows(dtype), 256) + 3  # 256: where the kernel takes every row count
    x = torch.randn(many_rows, 512, generator=torch.Generator().manual_seed(18)).to(dtype)
    many = layer(x)
    expected = F.linear(x, weight.to(dtype), bias.to(dtype))
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(many, expected, rtol=tolerance, atol=tolerance)
    few = layer(x[:5])
    if any(layer.column_parts):  # integer products of int16-rounded inputs (test_gguf_columns.py)
        tolerance = max(tolerance, 5e-4)
    torch.testing.assert_close(few.float(), expected[:5].float(), rtol=tolerance, atol=tolerance)
    assert torch.equal(layer(x[:1]), few[:1])


def test_layer_rejects_rows_that_do_not_fit_their_type():
    with pytest.raises(ValueError, match="uint8 \\[rows, 144\\]"):
        GgufLinear([("Q4_K", torch.zeros(4, 100, dtype=torch.uint8))], 256, None, KERNEL)
    with pytest.raises(ValueError, match="not a multiple"):
        GgufLinear([("Q6_K", torch.zeros(4, 210, dtype=torch.uint8))], 128, None, KERNEL)
    with pytest.raises(ValueError, match="GGUF type must be one of"):
        GgufLinear([("IQ4_XS", torch.zeros(4, 136, dtype=torch.uint8))], 256, None, KERNEL)


def test_moved_buffers_rebuild_the_c_segments():
    """The C segment array holds the buffers' addresses: a layer whose buffers moved (a load_state_dict
    into new tensors, a .to()) must point the kernel at the new ones, not at freed memory."""
    layer = GgufLinear([("Q4_K", _blocks(Q.Q4_K, 32, 256, 21, False))], 256, None, KERNEL)
    x = torch.randn(2, 256, generator=torch.Generator().manual_seed(22))
    before, segments = layer(x), layer.segments()
    assert layer.segments() is segments  # unchanged buffers: the same array, not rebuilt per call
    for name, buffer in list(layer.named_buffers()):
        setattr(layer, name, buffer.clone())
    assert layer.segments() is not segments
    assert torch.equal(layer(x), before)
