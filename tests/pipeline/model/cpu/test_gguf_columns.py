"""csrc/gguf_columns.c: Q5_0, Q8_0 and K-quant rows in column blocks (layers/gguf_columns.py packs
them) dequantize to gguf-py's values bit for bit, multiply with int16 inputs within their rounding
of the dequantized product, and give a row the same bits whatever other rows share the call, on
every build."""

from __future__ import annotations

import platform

import gguf
import numpy as np
import pytest
import torch

from pipeline.model.cpu import library as kernel_library
from pipeline.model.cpu.gguf_kernel import GgufLinearKernel, load_gguf_linear_kernel, segment_array
from pipeline.model.layers import gguf_columns
from pipeline.model.layers.gguf_linear import GgufLinear
from tests.support.kquant_blocks import quantize, random_blocks

Q = gguf.GGMLQuantizationType
KERNEL = load_gguf_linear_kernel()
pytestmark = pytest.mark.skipif(KERNEL is None, reason="no C compiler for the native kernels")
TYPES = [Q[name] for name in gguf_columns.COLUMN_TYPES]
OUT = 40  # two whole blocks of 16 columns and a padded one


def _in_features(qtype: Q) -> int:
    return 768 if gguf.GGML_QUANT_SIZES[qtype][0] == 256 else 800


def _raw(qtype: Q, rows: int, in_features: int, seed: int, random: bool) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if random:
        return random_blocks(qtype, rows, in_features, rng)
    return quantize((rng.standard_normal((rows, in_features)) * in_features ** -0.5).astype(np.float32), qtype)


def _columns(qtype: Q, raw: np.ndarray, in_features: int) -> tuple[dict[str, torch.Tensor], object]:
    packed = gguf_columns.pack(qtype.name, raw, in_features)
    return packed, segment_array([(int(qtype), packed, raw.shape[0])])


@pytest.mark.parametrize("qtype", TYPES, ids=lambda qtype: qtype.name)
def test_unpacked_values_rebuild_gguf_py_weights(qtype):
    """The numpy reading of the file's blocks (q and scales) gives gguf-py's weights by the block's formula."""
    in_features = _in_features(qtype)
    raw = _raw(qtype, 8, in_features, seed=1, random=True)
    parts = gguf_columns.unpack(qtype.name, raw, in_features)
    q = parts["q"].astype(np.float32)
    half = lambda bits: bits.view(np.float16).astype(np.float32)  # noqa: E731
    if qtype in (Q.Q5_0, Q.Q8_0):
        d = np.repeat(half(parts["d"]), 32, axis=1)
        weights = d * (q - 16) if qtype == Q.Q5_0 else q * d
    elif qtype == Q.Q6_K:
        scale = np.repeat(half(parts["d"]), 16, axis=1) * parts["sc"].astype(np.float32)
        weights = np.repeat(scale, 16, axis=1) * (q - 32)
    else:
        scale = np.repeat(half(parts["d"]), 8, axis=1) * parts["sc"].astype(np.float32)
        mins = np.repeat(half(parts["dmin"]), 8, axis=1) * parts["m"].astype(np.float32)
        weights = np.repeat(scale, 32, axis=1) * q - np.repeat(mins, 32, axis=1)
    reference = gguf.quants.dequantize(raw, qtype)
    assert np.array_equal(weights.view(np.uint32), reference.view(np.uint32))


@pytest.mark.parametrize("random", [False, True], ids=["quantized", "random-bytes"])
@pytest.mark.parametrize("qtype", TYPES, ids=lambda qtype: qtype.name)
def test_column_blocks_dequantize_to_gguf_py_bit_for_bit(qtype, random):
    in_features = _in_features(qtype)
    raw = _raw(qtype, OUT, in_features, seed=2, random=random)
    _, segments = _columns(qtype, raw, in_features)
    reference = gguf.quants.dequantize(raw, qtype)
    for portable in (False, True):  # this CPU's vector code, and the plain C
        ours = KERNEL.dequantize(segments, torch.empty(OUT, in_features), portable=portable).numpy()
        assert np.array_equal(ours.view(np.uint32), reference.view(np.uint32)), portable
        as_bf16 = KERNEL.dequantize(segments, torch.empty(OUT, in_features, dtype=torch.bfloat16), portable=portable)
        assert torch.equal(as_bf16, torch.from_numpy(reference).to(torch.bfloat16)), portable


@pytest.mark.parametrize("qtype", TYPES, ids=lambda qtype: qtype.name)
def test_product_is_within_int16_inputs_rounding_and_independent_of_row_count(qtype):
    in_features = _in_features(qtype)
    raw = _raw(qtype, OUT, in_features, seed=3, random=False)
    _, segments = _columns(qtype, raw, in_features)
    weight = torch.from_numpy(gguf.quants.dequantize(raw, qtype)).double()
    bias = torch.randn(OUT, generator=torch.Generator().manual_seed(4))
    x = torch.randn(32, in_features, generator=torch.Generator().manual_seed(5))
    full = KERNEL(x, segments, OUT, in_features, bias)
    # Each input rounded to 1 part in 65534 of its group's largest: ~1e-4 here, against ~1e-7 for float products.
    torch.testing.assert_close(full.double(), x.double() @ weight.T + bias.double(), rtol=0, atol=5e-4)
    for rows in (1, 2, 5, 9, 32):
        assert torch.equal(KERNEL(x[:rows], segments, OUT, in_features, bias), full[:rows]), rows
        assert torch.equal(KERNEL(x[rows - 1:rows], segments, OUT, in_features, bias), full[rows - 1:rows]), rows
    as_bf16 = KERNEL(x.to(torch.bfloat16), segments, OUT, in_features, bias)
    as_float = KERNEL(x.to(torch.bfloat16).float(), segments, OUT, in_features, bias)
    assert torch.equal(as_bf16, as_float.to(torch.bfloat16))


def test_column_segments_and_file_rows_make_one_weight():
    """A fused weight whose parts are held differently: Q4_0 rows (no column layout here) between
    Q5_0 and Q8_0 column blocks, each part written to its own output columns."""
    parts = [(Q.Q5_0, _raw(Q.Q5_0, 24, 256, 6, False)), (Q.Q4_0, _raw(Q.Q4_0, 5, 256, 7, False)),
             (Q.Q8_0, _raw(Q.Q8_0, 19, 256, 8, False))]
    held = [(int(qtype), gguf_columns.pack(qtype.name, raw, 256) if qtype != Q.Q4_0 else torch.from_numpy(raw),
             raw.shape[0]) for qtype, raw in parts]
    segments = segment_array(held)
    weight = torch.cat([torch.from_numpy(gguf.quants.dequantize(raw, qtype)) for qtype, raw in parts])
    assert torch.equal(KERNEL.dequantize(segments, torch.empty(48, 256)), weight)
    bias = torch.randn(48, generator=torch.Generator().manual_seed(9))
    x = torch.randn(3, 256, generator=torch.Generator().manual_seed(10))
    together = KERNEL(x, segments, 48, 256, bias)
    torch.testing.assert_close(together.double(), x.double() @ weight.double().T + bias.double(), rtol=0, atol=5e-4)
    for index, (_, raw) in enumerate(parts):  # each part as a layer of its own: the same bits
        first = sum(other.shape[0] for _, other in parts[:index])
        alone = segment_array([held[index]])
        part_bias = bias[first:first + raw.shape[0]].contiguous()
        assert torch.equal(KERNEL(x, alone, raw.shape[0], 256, part_bias), together[:, first:first + raw.shape[0]])


@pytest.mark.skipif(not KERNEL or not KERNEL.columns_fast, reason="column blocks are held only with AVX-512")
def test_a_layer_holds_column_blocks_of_about_the_files_bytes():
    parts = [("Q4_K", torch.from_numpy(_raw(Q.Q4_K, 64, 512, 11, False))),
             ("Q6_K", torch.from_numpy(_raw(Q.Q6_K, 32, 512, 12, False)))]
    layer = GgufLinear(parts, 512, None, KERNEL)
    assert all(layer.column_parts)
    file_bytes = sum(raw.numel() for _, raw in parts)
    assert file_bytes <= layer.resident_bytes() <= 1.03 * file_bytes  # Q4_K's 12 scale bytes held as 16
    reference = torch.cat([torch.from_numpy(gguf.quants.dequantize(raw.numpy(), Q[name])) for name, raw in parts])
    assert torch.equal(layer.dequantized(), reference)


def _kernel_built_for(march: str) -> GgufLinearKernel | None:
    flags = [("-march=" + march if flag == "-march=native" else flag) for flag in kernel_library._POOL_FLAGS]
    library = kernel_library._load_library(f"gguf_columns_{march}", flags,
                                           ("thread_pool", "gguf_linear", "gguf_columns"))
    return None if library is None else GgufLinearKernel(library)


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86 vector paths")
def test_the_portable_build_gives_the_native_builds_bits():
    other = _kernel_built_for("x86-64")
    if other is None:
        pytest.skip("no C compiler")
    for qtype in TYPES:
        in_features = _in_features(qtype)
        raw = _raw(qtype, 20, in_features, seed=13, random=True)
        _, segments = _columns(qtype, raw, in_features)
        for rows in (1, 2, 9):
            x = torch.randn(rows, in_features, generator=torch.Generator().manual_seed(rows))
            assert torch.equal(KERNEL(x, segments, 20, in_features, None), other(x, segments, 20, in_features, None)), (
                qtype.name, rows)
        assert torch.equal(other.dequantize(segments, torch.empty(20, in_features)),
                           KERNEL.dequantize(segments, torch.empty(20, in_features)))
