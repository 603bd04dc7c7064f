"""Weight-only quantized linears (int8 per channel, GGUF Q4_0/Q4_1 blocks as int4) against a
dequantize-then-matmul reference, and greedy generation through them on tiny models."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from pipeline.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from pipeline.engine import LLMEngine
from pipeline.loading.gguf.quant_blocks import decode_q4
from pipeline.model.cpu.kernels import load_quantized_linear_kernel
from pipeline.model.layers import quantized_linear
from pipeline.model.layers.quantized_linear import (
    Int4Linear,
    Int8Linear,
    native_kernel_for,
    quantized_kernels_work,
)
from pipeline.request.sampling_params import SamplingParams
from tests.support.engine_helpers import run_requests
from tests.support.gguf_files import write_gguf
from tests.support.hf_models import make_tiny_hf_model

pytestmark = pytest.mark.skipif(not quantized_kernels_work(), reason="torch lacks the CPU int8/int4 kernels")
Q = gguf.GGMLQuantizationType


def _bf16_matmul_reference(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x W^T in float32 from bfloat16-rounded inputs (what the kernels see)."""
    return x.bfloat16().float() @ weight.float().t()


def test_int8_linear_equals_dequantize_then_matmul():
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(96, 64, generator=generator)
    weight[3] = 0.0  # an all-zero row quantizes to zeros, not NaN
    bias = torch.randn(96, generator=generator)
    layer = Int8Linear.from_float(weight, bias)
    x = torch.randn(5, 64, generator=generator)
    out = layer(x)
    assert out.dtype == torch.float32 and out.shape == (5, 96)
    expected = _bf16_matmul_reference(x, layer.dequantized()) + bias
    torch.testing.assert_close(out, expected, atol=0.1, rtol=2e-2)  # bfloat16 output rounding
    # Per-channel int8 keeps each weight within half a step (max |w| of its row / 127, rounded to
    # bfloat16: up to 2^-8 more) of the original.
    step = weight.abs().amax(dim=1, keepdim=True) / 127
    assert bool(((layer.dequantized() - weight).abs() <= step * 0.5 * (1 + 2**-7) + 1e-6).all())
    assert torch.count_nonzero(layer.dequantized()[3]) == 0


@pytest.mark.parametrize("qtype", [Q.Q4_0, Q.Q4_1])
def test_gguf_q4_blocks_decode_exactly_and_multiply_as_dequantized(qtype):
    rng = np.random.default_rng(int(qtype))
    weight = rng.standard_normal((48, 128)).astype(np.float32)
    raw = gguf.quants.quantize(weight, qtype)  # [48, blocks * block bytes] uint8, as in a file
    reference = torch.from_numpy(gguf.quants.dequantize(raw, qtype).copy())
    values, scales, zeros = decode_q4(raw, qtype.name)
    assert values.shape == (48, 128) and int(values.max()) <= 15
    ours = (values.float() - 8) * scales.repeat_interleave(32, dim=1) + zeros.repeat_interleave(32, dim=1)
    torch.testing.assert_close(ours, reference, atol=1e-6, rtol=1e-6)
    layer = Int4Linear(values, scales, zeros, bias=None)
    # The kernel's scales and zeros are bfloat16: its weight is the reference to bfloat16 rounding.
    torch.testing.assert_close(layer.dequantized(), reference, atol=0.02, rtol=0.01)
    x = torch.from_numpy(rng.standard_normal((3, 128)).astype(np.float32))
    torch.testing.assert_close(layer(x), _bf16_matmul_reference(x, layer.dequantized()), atol=0.15, rtol=2e-2)


def _native():
    kernel = load_quantized_linear_kernel()
    if kernel is None:
        pytest.skip("no C compiler")
    return kernel


def _group_exact_inputs(rng: np.random.Generator, rows: int, in_features: int) -> torch.Tensor:
    """x whose groups of 32 are whole multiples of their max / 32767: the kernel's int16 copy of x is exact."""
    steps = torch.from_numpy(rng.integers(-32767, 32768, (rows, in_features))).float()
    steps[:, ::32] = 32767.0  # each group's largest magnitude is 32767 steps
    group_scales = torch.from_numpy(rng.uniform(0.01, 2.0, (rows, -(-in_features // 32)))).float()
    return steps * group_scales.repeat_interleave(32, dim=1)[:, :in_features]


@pytest.mark.parametrize("in_features", [56, 64])  # 56: the last group padded with zeros
def test_native_int8_linear_is_the_float32_product_with_the_dequantized_weight(in_features):
    rng = np.random.default_rng(in_features)
    weight = torch.from_numpy(rng.standard_normal((70, in_features)).astype(np.float32))
    bias = torch.from_numpy(rng.standard_normal(70).astype(np.float32))
    layer = Int8Linear.from_float(weight, bias, _native())
    torch.testing.assert_close(layer.dequantized(), Int8Linear.from_float(weight, bias).dequantized())
    x = _group_exact_inputs(rng, 19, in_features)
    weight = layer.dequantized().double()
    expected = x.double() @ weight.t() + bias.double()
    magnitude = x.double().abs() @ weight.abs().t()  # float32 sums round relative to their terms
    for rows in (1, 3, 8, 19):  # 19: two groups of 8 rows and 3 more
        assert bool(((layer(x[:rows]).double() - expected[:rows]).abs() <= 1e-6 * magnitude[:rows] + 1e-5).all())
    x = torch.randn(2, in_features).bfloat16()
    assert layer(x).dtype == torch.bfloat16
    torch.testing.assert_close(layer(x).float(), layer(x.float()), atol=0.0, rtol=2**-8)


@pytest.mark.parametrize("qtype", [Q.Q4_0, Q.Q4_1])
def test_native_int4_linear_reads_gguf_blocks_exactly(qtype):
    rng = np.random.default_rng(int(qtype) + 7)
    raw = gguf.quants.quantize(rng.standard_normal((40, 96)).astype(np.float32), qtype)
    reference = torch.from_numpy(gguf.quants.dequantize(raw, qtype).copy())
    bias = torch.from_numpy(rng.standard_normal(40).astype(np.float32))
    layer = Int4Linear(*decode_q4(raw, qtype.name), bias, _native())
    torch.testing.assert_close(layer.dequantized(), reference, atol=0.0, rtol=0.0)  # GGUF's float16 d and m kept
    x = _group_exact_inputs(rng, 19, 96)  # the kernel's int8 x is exact: the float32 product
    expected = x.double() @ reference.double().t() + bias.double()
    # The kernel sums d * (q . x) and m * sum(x) apart, terms up to sum |x| * max |w| that largely
    # cancel: float32 rounding relative to those.
    scale = x.abs().sum(dim=1, keepdim=True).double() * reference.abs().amax().double()
    for rows in (1, 5, 8, 19):
        assert bool(((layer(x[:rows]).double() - expected[:rows]).abs() <= 1e-6 * scale[:rows]).all())


def test_native_int4_linear_on_any_input_is_within_int16_activation_rounding():
    rng = np.random.default_rng(3)
    raw = gguf.quants.quantize(rng.standard_normal((64, 128)).astype(np.float32), Q.Q4_1)
    layer = Int4Linear(*decode_q4(raw, "Q4_1"), None, _native())
    x = torch.from_numpy(rng.standard_normal((4, 128)).astype(np.float32))
    expected = x.double() @ layer.dequantized().double().t()
    error = (layer(x).double() - expected).abs()
    # Each x value moves by at most half a step (its group's max / 65534); the output by that times
    # the weights. Bound it loosely by max|x| / 65534 * sum |w| per row, plus float32 summation.
    bound = x.abs().amax(dim=1, keepdim=True).double() / 65534 * layer.dequantized().abs().sum(dim=1).double()
    assert bool((error <= bound + 1e-4).all())
    assert float(error.mean()) < 1e-4 * float(expected.pow(2).mean().sqrt())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kind", ["int4", "int8"])
def test_native_many_rows_multiply_by_the_dequantized_weight(monkeypatch, kind, dtype):
    rng = np.random.default_rng(9)
    weight = rng.standard_normal((48, 128)).astype(np.float32)
    bias = torch.from_numpy(rng.standard_normal(48).astype(np.float32))
    if kind == "int4":
        layer = Int4Linear(*decode_q4(gguf.quants.quantize(weight, Q.Q4_1), "Q4_1"), bias, _native())
        layer.many_rows_on_amx = False  # the dequantized path itself (AMX tiles: test_int4_amx.py)
        dequantized = layer.native.dequantize_int4(layer.column_blocks, layer.block_scales, 48, dtype)
        kernel = lambda rows: layer.native.int4(rows, layer.column_blocks, layer.block_scales, 48, bias)  # noqa: E731
    else:
        layer = Int8Linear.from_float(torch.from_numpy(weight), bias, _native())
        dequantized = layer.native.dequantize_int8(layer.column_blocks, layer.scales, 48, 128, dtype)
        kernel = lambda rows: layer.native.int8(rows, layer.column_blocks, layer.scales, 48, 128, bias)  # noqa: E731
    assert torch.equal(dequantized, layer.dequantized().to(dtype))  # the same float32 math, then rounded
    x = torch.from_numpy(rng.standard_normal((40, 256)).astype(np.float32)).to(dtype)
    monkeypatch.setattr(quantized_linear, "dequantize_min_rows", lambda _dtype, bits=4: 16)
    ours = layer(x[:, :128])
    assert torch.equal(ours, torch.nn.functional.linear(x[:, :128], layer.dequantized().to(dtype), bias.to(dtype)))
    # Outputs here reach ~30: the kernels' int16 activations move them by up to ~5e-3, bfloat16
    # rounding of the output by up to 2^-8 of their size.
    tolerance = 1e-2 if dtype == torch.float32 else 0.125
    torch.testing.assert_close(ours.float(), kernel(x[:, :128]).float(), atol=tolerance, rtol=0.0)
    assert layer.forward_gated(x) is None and layer.forward_float32(x[:, :128]) is None  # per op from 16 rows
    assert layer.forward_gated(x[:8]) is not None and layer(x[:8, :128]).shape == (8, 48)
    # 20 output rows a chunk: 20, 20, 8 (int4: whole blocks of 16 columns, so 16, 16, 16)
    monkeypatch.setattr(quantized_linear, "_DEQUANTIZE_CHUNK", 128 * 20)
    torch.testing.assert_close(layer(x[:, :128]), ours, atol=1e-4, rtol=1e-5)  # the product's blocking may differ


def test_dequantize_rows_by_dtype_bits_and_cpu(monkeypatch):
    monkeypatch.setattr(quantized_linear, "_bfloat16_arithmetic", lambda: True)
    assert quantized_linear.dequantize_min_rows(torch.bfloat16) == 128
    assert quantized_linear.dequantize_min_rows(torch.float32) == 128
    assert quantized_linear.dequantize_min_rows(torch.bfloat16, bits=8) == 256
    assert quantized_linear.dequantize_min_rows(torch.float32, bits=8) == quantized_linear.ALWAYS_KERNEL
    monkeypatch.setattr(quantized_linear, "_bfloat16_arithmetic", lambda: False)  # torch's bf16 product is slow
    assert quantized_linear.dequantize_min_rows(torch.bfloat16) == quantized_linear.ALWAYS_KERNEL
    assert quantized_linear.dequantize_min_rows(torch.float16) == quantized_linear.ALWAYS_KERNEL


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kind", ["int4", "int8"])
def test_native_quantized_down_projection_applies_silu_gating(kind, dtype):
    rng = np.random.default_rng(5)
    weight = rng.standard_normal((40, 64)).astype(np.float32)
    if kind == "int4":
        layer = Int4Linear(*decode_q4(gguf.quants.quantize(weight, Q.Q4_0), "Q4_0"), None, _native())
    else:
        layer = Int8Linear.from_float(torch.from_numpy(weight), None, _native())
    gate_up = torch.from_numpy(rng.standard_normal((5, 128)).astype(np.float32)).to(dtype)
    gate, up = gate_up.split(64, dim=-1)
    unfused = layer(torch.nn.functional.silu(gate) * up)
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2  # expf vs torch's exp in the last bit
    torch.testing.assert_close(layer.forward_gated(gate_up), unfused, atol=tolerance, rtol=tolerance)
    assert Int8Linear.from_float(torch.from_numpy(weight)).forward_gated(gate_up) is None  # torch's kernel: unfused


def _engine(model: str, dtype: str, quantization: str, cpu_linear: str = "auto") -> LLMEngine:
    return LLMEngine(EngineConfig(model=ModelConfig(model=model, dtype=dtype, quantization=quantization,
                                                    cpu_linear=cpu_linear),
                                  cache=CacheConfig(num_kv_blocks=64),
                                  scheduler=SchedulerConfig(max_num_batched_tokens=256, max_num_seqs=8)))


def _greedy(engine: LLMEngine, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    results = run_requests(engine, {f"r{i}": (prompt, params) for i, prompt in enumerate(prompts)})
    return [results[f"r{i}"]["choices"][0]["token_ids"] for i in range(len(prompts))]


def _first_token_agreement(ours: list[list[int]], reference: list[list[int]]) -> float:
    """Share of prompts whose first greedy token agrees: each a next-token choice from the same
    context (later tokens follow the context each side generated, so one near-tie decides them all)."""
    return sum(a[0] == b[0] for a, b in zip(ours, reference, strict=True)) / len(reference)


PROMPTS = [np.random.default_rng(seed).integers(3, 512, 4 + seed % 13).tolist() for seed in range(24)]


def test_int8_greedy_generation_mostly_agrees_with_float(tmp_path):
    model_dir = make_tiny_hf_model("llama", tmp_path / "llama", seed=3)
    reference = _greedy(_engine(str(model_dir), "float32", "none"), PROMPTS, 6)
    engine = _engine(str(model_dir), "float32", "int8")
    assert any(isinstance(module, Int8Linear) for module in engine.runner.model.modules())
    ours = _greedy(engine, PROMPTS, 6)
    assert all(len(tokens) == 6 for tokens in ours)
    assert _first_token_agreement(ours, reference) >= 0.75, (ours, reference)


@pytest.mark.parametrize("cpu_linear", ["auto", "torch"])  # our kernel, torch's
def test_gguf_quantization_keeps_q4_blocks_and_agrees_with_the_dequantized_model(tmp_path, cpu_linear):
    model_dir = make_tiny_hf_model("llama", tmp_path / "llama", seed=4)
    path = write_gguf(model_dir, tmp_path / "tiny-q4_1.gguf", Q.Q4_1)
    reference = _greedy(_engine(str(path), "bfloat16", "none"), PROMPTS, 6)
    engine = _engine(str(path), "bfloat16", "gguf", cpu_linear)
    kinds = {type(module).__name__ for module in engine.runner.model.modules()}
    assert "Int4Linear" in kinds and "Linear" not in kinds, kinds
    natives = {module.native is not None for module in engine.runner.model.modules() if isinstance(module, Int4Linear)}
    assert natives == {native_kernel_for(cpu_linear) is not None}
    ours = _greedy(engine, PROMPTS, 6)
    assert all(len(tokens) == 6 for tokens in ours)
    assert _first_token_agreement(ours, reference) >= 0.75, (ours, reference)


def test_auto_takes_the_native_quantized_kernel_whatever_the_vector_width(monkeypatch):
    for capability in ("AVX2", "AVX512"):
        monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda capability=capability: capability)
        assert native_kernel_for("auto") is load_quantized_linear_kernel()
        assert native_kernel_for("torch") is None
        assert native_kernel_for("onednn") is None


def test_gguf_quantization_of_an_hf_checkpoint_is_a_clear_error(tmp_path):
    model_dir = make_tiny_hf_model("llama", tmp_path / "llama", seed=5)
    with pytest.raises(ValueError, match="quantization 'gguf' needs a model converted from a GGUF file"):
        _engine(str(model_dir), "float32", "gguf")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kind", ["int4", "int8"])
def test_native_float32_output_is_the_layer_output_widened(kind, dtype):
    """forward_float32 (an LM head's logits in one call) is exactly self(x).float(): in bfloat16 the
    kernel rounds each value to bfloat16 before writing it as float32."""
    rng = np.random.default_rng(8)
    weight = rng.standard_normal((72, 64)).astype(np.float32)
    if kind == "int4":
        layer = Int4Linear(*decode_q4(gguf.quants.quantize(weight, Q.Q4_1), "Q4_1"), None, _native())
    else:
        layer = Int8Linear.from_float(torch.from_numpy(weight), None, _native())
    x = torch.from_numpy(rng.standard_normal((3, 64)).astype(np.float32)).to(dtype)
    widened = layer.forward_float32(x)
    assert widened.dtype == torch.float32
    assert torch.equal(widened, layer(x).float())
    assert Int8Linear.from_float(torch.from_numpy(weight)).forward_float32(x) is None  # torch's kernel
