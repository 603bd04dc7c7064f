"""oneDNN packed linears (pipeline/model/cpu/linear.py): same results as nn.Linear up to float32
reordering, swapped in only where asked, and the runner's logits agree either way."""

from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from pipeline.config import CacheConfig, ModelConfig, SchedulerConfig
from pipeline.model.cpu.kernels import PanelLinearKernel, load_few_rows_linear_kernel, load_panel_linear_kernel
from pipeline.model.cpu.library import cpu_flags
from pipeline.model.cpu.linear import (
    FewRowsLinear,
    PackedLinear,
    few_rows_kernel_for,
    onednn_linear_works,
    pack_linears,
    padded_row_count,
)
from pipeline.model.layers.mlp import GatedMLP
from pipeline.model.runner import ModelRunner, dummy_prefill_inputs
from tests.support.hf_models import make_tiny_hf_model

pytestmark = pytest.mark.skipif(not onednn_linear_works(torch.float32), reason="this torch build has no oneDNN linear")


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("num_rows", [0, 1, 7, 128, 300])
def test_packed_linear_matches_nn_linear(bias: bool, num_rows: int) -> None:
    torch.manual_seed(num_rows)
    linear = nn.Linear(96, 200, bias=bias)
    x = torch.randn(num_rows, 96)
    with torch.no_grad():
        ours, reference = PackedLinear(linear)(x), F.linear(x, linear.weight, linear.bias)
    assert ours.shape == reference.shape == (num_rows, 200)
    torch.testing.assert_close(ours, reference, atol=1e-5, rtol=1e-5)


def test_row_counts_pad_to_few_shapes_with_bounded_waste() -> None:
    padded = [padded_row_count(rows) for rows in range(2049)]
    assert all(p >= rows for rows, p in enumerate(padded))
    assert all(p - rows <= 7 for rows, p in enumerate(padded[:129]))
    assert all(p - rows <= rows / 8 for rows, p in enumerate(padded) if rows > 128)
    assert len(set(padded)) == 49  # 0, 16 multiples of 8 up to 128, then 8 per doubling up to 2048
    assert [padded_row_count(r) for r in (1, 8, 9, 100, 129, 2000, 2049)] == [8, 8, 16, 104, 144, 2048, 2304]


def test_packed_linear_keeps_leading_dimensions() -> None:
    linear = nn.Linear(16, 12)
    x = torch.randn(3, 5, 16)
    with torch.no_grad():
        torch.testing.assert_close(PackedLinear(linear)(x), linear(x), atol=1e-5, rtol=1e-5)


def test_pack_linears_replaces_every_linear_and_leaves_tied_embeddings_alone() -> None:
    model = nn.Sequential(nn.Embedding(10, 8), nn.Sequential(nn.Linear(8, 8), nn.ReLU()), nn.Linear(8, 10))
    model[2].weight = model[0].weight  # tied, like lm_head and embed_tokens
    assert pack_linears(model) == 2
    assert not any(type(module) is nn.Linear for module in model.modules())
    assert isinstance(model[1][0], PackedLinear) and isinstance(model[2], PackedLinear)
    assert model[0].weight.shape == (10, 8) and not model[0].weight.is_mkldnn


def _runner(path: Path, cpu_linear: str) -> ModelRunner:
    return ModelRunner(ModelConfig(quantization="none", dtype="float32", device="cpu", cpu_linear=cpu_linear),
                       CacheConfig(num_kv_blocks=16),
                       SchedulerConfig(), str(path))


@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])  # qkv bias + tied embeddings; q/k norm
def test_runner_logits_agree_with_and_without_onednn(tmp_path: Path, arch: str) -> None:
    path = make_tiny_hf_model(arch, tmp_path / arch)
    packed, plain = _runner(path, "onednn"), _runner(path, "torch")
    assert any(isinstance(m, PackedLinear) for m in packed.model.modules())
    assert not any(isinstance(m, PackedLinear) for m in plain.model.modules())
    inputs = dummy_prefill_inputs(40, 3, 64)
    inputs.input_ids[:] = np.random.default_rng(0).integers(3, 500, size=inputs.num_tokens)
    torch.testing.assert_close(packed.execute(inputs), plain.execute(inputs), atol=1e-4, rtol=1e-4)


def test_few_rows_path_takes_the_kernel_for_up_to_4_rows_and_onednn_above() -> None:
    kernel = load_few_rows_linear_kernel()
    if kernel is None:
        pytest.skip("no C compiler")
    torch.manual_seed(3)
    linear = nn.Linear(68, 48)  # 68: the kernel's 32- or 16-wide loop and a scalar tail
    hybrid = PackedLinear(linear, kernel)
    one, few, many = torch.randn(1, 1, 68), torch.randn(2, 2, 68), torch.randn(5, 68)
    with torch.no_grad():
        for x in (one, few):
            torch.testing.assert_close(hybrid(x), F.linear(x, linear.weight, linear.bias), atol=1e-5, rtol=1e-5)
            assert torch.equal(hybrid(x), kernel(x.reshape(-1, 68), linear.weight.detach(), linear.bias).view_as(
                hybrid(x)))
        assert torch.equal(hybrid(many), PackedLinear(linear)(many))
        assert hybrid(torch.randn(0, 68)).shape == (0, 48)  # a step with no logits rows
    assert PackedLinear(linear).plain_weight is None


@pytest.mark.parametrize("rows", [1, 5, 8])
def test_few_rows_kernel_reads_bfloat16_weights(rows: int) -> None:
    kernel = load_few_rows_linear_kernel()
    if kernel is None:
        pytest.skip("no C compiler")
    torch.manual_seed(rows)
    linear = nn.Linear(40, 24).to(torch.bfloat16)
    x = torch.randn(rows, 40)
    expected = F.linear(x, linear.weight.float(), linear.bias.float())  # float32 sums of the same values
    torch.testing.assert_close(FewRowsLinear(linear, kernel)(x), expected, atol=1e-5, rtol=1e-5)
    many = torch.randn(9, 40, dtype=torch.bfloat16)  # above 8 rows: torch's own product
    assert torch.equal(FewRowsLinear(linear, kernel)(many), F.linear(many, linear.weight, linear.bias))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_few_rows_float32_output_is_the_layer_output_widened(dtype: torch.dtype) -> None:
    """forward_float32 (an LM head's logits in one call) is exactly self(x).float(), and None where
    the kernel does not take the rows."""
    kernel = load_few_rows_linear_kernel()
    if kernel is None:
        pytest.skip("no C compiler")
    torch.manual_seed(4)
    linear = nn.Linear(40, 24).to(dtype)
    layer = FewRowsLinear(linear, kernel) if dtype == torch.bfloat16 else PackedLinear(linear, kernel)
    x = torch.randn(3, 40, dtype=dtype)
    widened = layer.forward_float32(x)
    assert widened.dtype == torch.float32 and torch.equal(widened, layer(x).float())
    assert layer.forward_float32(torch.randn(9, 40, dtype=dtype)) is None


@pytest.mark.parametrize("weight_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", range(1, 9))
def test_few_rows_kernel_matches_float64_for_every_row_count(rows: int, weight_dtype: torch.dtype) -> None:
    kernel = load_few_rows_linear_kernel()
    if kernel is None:
        pytest.skip("no C compiler")
    torch.manual_seed(rows)
    weight = torch.randn(24, 56).to(weight_dtype)  # 56: a two-chunk step, a one-chunk step and a tail of 8
    x = torch.randn(rows, 56)
    expected = x.double() @ weight.double().t()
    torch.testing.assert_close(kernel(x, weight, None).double(), expected, atol=1e-5, rtol=1e-5)


def test_few_rows_kernel_splits_a_large_weight_across_threads() -> None:
    kernel = load_few_rows_linear_kernel()
    if kernel is None:
        pytest.skip("no C compiler")
    torch.manual_seed(5)
    weight, bias = torch.randn(2100, 1000), torch.randn(2100)  # 8.4 MB: above the one-thread size
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        for rows in (1, 3):
            x = torch.randn(rows, 1000)
            expected = (x.double() @ weight.double().t() + bias.double()).float()
            torch.testing.assert_close(kernel(x, weight, bias), expected, atol=1e-4, rtol=1e-4)
    finally:
        torch.set_num_threads(previous)


def test_few_rows_kernel_calls_from_several_threads_at_once_stay_exact() -> None:
    """The kernels share one thread pool; callers on other Python threads (ctypes drops the GIL)
    take turns on it, and every call's result is the one it gets alone."""
    kernel = load_few_rows_linear_kernel()
    if kernel is None:
        pytest.skip("no C compiler")
    torch.manual_seed(8)
    weight = torch.randn(1500, 512)  # 3 MB: split across the pool's threads
    inputs = [torch.randn(1 + index % 4, 512) for index in range(6)]
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        alone = [kernel(x, weight, None) for x in inputs]
        with ThreadPoolExecutor(max_workers=3) as callers:
            together = list(callers.map(lambda x: [kernel(x, weight, None) for _ in range(20)], inputs))
    finally:
        torch.set_num_threads(previous)
    for expected, results in zip(alone, together, strict=True):
        assert all(torch.equal(result, expected) for result in results)


def _kernel_in_forked_child(weight: torch.Tensor, x: torch.Tensor, results: multiprocessing.Queue) -> None:
    torch.set_num_threads(2)
    threads_before = len(os.listdir("/proc/self/task"))
    out = load_few_rows_linear_kernel()(x, weight, None)
    started = len(os.listdir("/proc/self/task")) - threads_before
    results.put((out.tolist(), started))  # plain data: the child exits first


def test_a_forked_child_runs_the_pooled_kernels_on_workers_of_its_own() -> None:
    kernel = load_few_rows_linear_kernel()
    if kernel is None:
        pytest.skip("no C compiler")
    torch.manual_seed(9)
    weight, x = torch.randn(1500, 512), torch.randn(2, 512)
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        expected = kernel(x, weight, None)  # the parent's pool has started its worker
    finally:
        torch.set_num_threads(previous)
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    child = context.Process(target=_kernel_in_forked_child, args=(weight, x, results))
    child.start()
    got, threads_started = results.get(timeout=60)
    child.join(timeout=60)
    assert child.exitcode == 0 and torch.equal(torch.tensor(got), expected)
    assert threads_started == 1  # the parent's worker did not survive the fork: the child starts its own


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gated_mlp_down_projection_applies_silu_gating_in_the_kernel(dtype: torch.dtype) -> None:
    kernel = load_few_rows_linear_kernel()
    if kernel is None:
        pytest.skip("no C compiler")
    torch.manual_seed(12)
    mlp = GatedMLP(48, 40).to(dtype)
    reference = GatedMLP(48, 40).to(dtype)
    reference.load_state_dict(mlp.state_dict())
    mlp.down_proj = FewRowsLinear(mlp.down_proj, kernel)
    reference.down_proj = FewRowsLinear(reference.down_proj, kernel)
    reference.down_proj.forward_gated = lambda _gate_up: None  # the same kernel fed by torch's ops
    with torch.no_grad():
        for rows in (1, 3, 8, 9):  # 9: above the kernel's rows, the unfused path
            x = torch.randn(rows, 48).to(dtype)
            tolerance = 1e-6 if dtype == torch.float32 else 1e-2  # expf vs torch's exp in the last bit
            torch.testing.assert_close(mlp(x), reference(x), atol=tolerance, rtol=tolerance)


def test_auto_uses_the_few_rows_kernel_whatever_the_vector_width(monkeypatch: pytest.MonkeyPatch) -> None:
    for capability in ("AVX2", "AVX512"):
        monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda capability=capability: capability)
        assert few_rows_kernel_for("auto", torch.float32) is load_few_rows_linear_kernel()
        assert few_rows_kernel_for("auto", torch.bfloat16) is load_few_rows_linear_kernel()
        assert few_rows_kernel_for("onednn", torch.float32) is None
        assert few_rows_kernel_for("auto", torch.float16) is None


def test_few_rows_kernel_takes_and_returns_bfloat16_rounding_its_float32_sums_as_torch_does() -> None:
    kernel = load_few_rows_linear_kernel()
    if kernel is None:
        pytest.skip("no C compiler")
    torch.manual_seed(11)
    linear = nn.Linear(40, 24).to(torch.bfloat16)
    x = torch.randn(3, 40).to(torch.bfloat16)
    ours = kernel(x, linear.weight.detach(), linear.bias)
    assert ours.dtype == torch.bfloat16
    assert torch.equal(ours, kernel(x.float(), linear.weight.detach(), linear.bias).to(torch.bfloat16))


def _panel_kernel() -> PanelLinearKernel:
    """The panel kernel; the test skips where there is none (no AVX-512 or AVX2, or no C compiler)."""
    kernel = load_panel_linear_kernel()
    if kernel is None:
        pytest.skip("no AVX-512 or AVX2, or no C compiler")
    return kernel


@pytest.mark.parametrize("rows", [1, 7, 8, 9, 33, 64, 130])
@pytest.mark.parametrize("shape", [(37, 19), (100, 68), (64, 1536)])  # a part-filled panel; K in any size
def test_panel_kernel_matches_float64_with_bias_and_gating(rows: int, shape: tuple[int, int]) -> None:
    kernel = _panel_kernel()
    torch.manual_seed(rows)
    out_features, in_features = shape
    weight, bias = torch.randn(out_features, in_features), torch.randn(out_features)
    x, gate_up = torch.randn(rows, in_features), torch.randn(rows, 2 * in_features)
    panels = kernel.pack(weight)
    expected = x.double() @ weight.double().T + bias.double()
    torch.testing.assert_close(kernel(x, panels, out_features, bias).double(), expected, atol=1e-4, rtol=1e-5)
    gated = F.silu(gate_up[:, :in_features].double()) * gate_up[:, in_features:].double()
    torch.testing.assert_close(kernel(gate_up, panels, out_features, None, gated=True).double(),
                               gated @ weight.double().T, atol=1e-4, rtol=1e-5)
    # Each output sums alone, k in order: the same values whatever else shares the call.
    assert torch.equal(kernel(x[:1], panels, out_features, bias), kernel(x, panels, out_features, bias)[:1])


def test_float32_packed_linear_keeps_panels_instead_of_the_plain_weight_and_uses_them_up_to_64_rows() -> None:
    panel, few_rows = _panel_kernel(), load_few_rows_linear_kernel()  # one library: both or neither
    torch.manual_seed(5)
    linear = nn.Linear(68, 48)
    layer = PackedLinear(linear, few_rows, panel)
    assert layer.plain_weight is None and layer.few_rows is None and layer.panels is not None
    with torch.no_grad():
        for rows in (1, 4, 5, 64, 65, PackedLinear.FLOAT32_PANEL_ROWS):
            x = torch.randn(rows, 68)
            assert torch.equal(layer(x), panel(x, layer.panels, 48, linear.bias))
        many = torch.randn(PackedLinear.FLOAT32_PANEL_ROWS + 1, 68)
        assert torch.equal(layer(many), PackedLinear(linear)(many))  # oneDNN above FLOAT32_PANEL_ROWS
        gate_up = torch.randn(3, 136)
        assert torch.equal(layer.forward_gated(gate_up), panel(gate_up, layer.panels, 48, linear.bias, gated=True))
    if not onednn_linear_works(torch.bfloat16):
        return  # (AVX2 without AVX-NE-CONVERT: bfloat16 layers are not packed; FewRowsLinear takes them)
    bf16 = PackedLinear(linear.to(torch.bfloat16), few_rows, panel)
    if panel.bf16_available:  # bfloat16 panels (AVX512-BF16), else the few-rows kernel's plain weight
        assert bf16.panels is not None and bf16.panels.dtype == torch.bfloat16 and bf16.plain_weight is None
        x = torch.randn(7, 68).bfloat16()
        assert torch.equal(bf16(x), panel(x, bf16.panels, 48, linear.bias))
        assert torch.equal(bf16.forward_float32(x), panel(x, bf16.panels, 48, linear.bias, float32_out=True))
        # With AMX, oneDNN's bfloat16 product overtakes the panels from a few rows.
        amx = "amx_bf16" in cpu_flags()
        assert bf16.panel_rows == (PackedLinear.AMX_PANEL_ROWS if amx else PackedLinear.PANEL_ROWS)
        above = torch.randn(bf16.panel_rows + 1, 68).bfloat16()
        assert torch.equal(bf16(above), PackedLinear(linear)(above))
    else:
        assert bf16.panels is None and bf16.plain_weight is not None


@pytest.mark.parametrize("rows", [1, 5, 8, 9, 33, 130])
@pytest.mark.parametrize("shape", [(37, 19), (100, 68), (64, 1536), (40, 576)])  # part-filled panels, a lone half
def test_wide_panels_of_bfloat16_valued_float32_weights_give_the_float32_panels_bits(
        rows: int, shape: tuple[int, int]) -> None:
    """Float32 weights that are bfloat16 values, packed as their halves and widened in the kernel: the
    float32 panels' outputs bit for bit, plain, with bias, gated, from bfloat16 rows and to float32."""
    kernel = _panel_kernel()
    out_features, in_features = shape
    generator = torch.Generator().manual_seed(rows + out_features)
    weight = torch.randn(out_features, in_features, generator=generator).bfloat16().float()
    bias = torch.randn(out_features, generator=generator)
    x, gate_up = (torch.randn(rows, n, generator=generator) for n in (in_features, 2 * in_features))
    full, wide = kernel.pack(weight), kernel.pack_halves(weight)
    assert wide is not None and wide.dtype == torch.int32 and wide.numel() * 2 == full.numel()
    assert torch.equal(kernel(x, wide, out_features, bias), kernel(x, full, out_features, bias))
    assert torch.equal(kernel(gate_up, wide, out_features, None, gated=True),
                       kernel(gate_up, full, out_features, None, gated=True))
    assert torch.equal(kernel(x.bfloat16(), wide, out_features, bias, float32_out=True),
                       kernel(x.bfloat16(), full, out_features, bias, float32_out=True))
    torch.testing.assert_close(kernel(x, wide, out_features, bias).double(),
                               x.double() @ weight.double().T + bias.double(), atol=1e-4, rtol=1e-5)


def test_only_float32_weights_that_are_bfloat16_values_keep_wide_panels() -> None:
    panel, few_rows = _panel_kernel(), load_few_rows_linear_kernel()  # one library: both or neither
    torch.manual_seed(6)
    linear = nn.Linear(68, 48)
    with torch.no_grad():
        linear.weight.copy_(linear.weight.bfloat16().float())
    layer = PackedLinear(linear, few_rows, panel)
    assert layer.panels is not None and layer.panels.dtype == torch.int32
    assert layer.panel_rows == PackedLinear.FLOAT32_PANEL_ROWS
    with torch.no_grad():
        x = torch.randn(9, 68)
        assert torch.equal(layer(x), panel(x, panel.pack(linear.weight), 48, linear.bias))
        linear.weight[47, 67] += 2.0 ** -20  # the last weight of a part-filled panel: no longer a bfloat16 value
    assert panel.pack_halves(linear.weight) is None
    assert PackedLinear(linear, few_rows, panel).panels.dtype == torch.float32
    assert panel.pack_halves(linear.weight.bfloat16()) is None  # bfloat16 weights keep their pair panels


@pytest.mark.parametrize("rows", [1, 3, 8, 9, 64])
@pytest.mark.parametrize("shape", [(37, 19), (100, 68), (64, 1536)])  # part-filled panels, odd K (a padded pair)
def test_bfloat16_panel_kernel_matches_float64_of_the_bfloat16_values(rows: int, shape: tuple[int, int]) -> None:
    """Exact products summed in float32, then rounded once to bfloat16: within one bfloat16 step of
    the float64 product of the same bfloat16 inputs."""
    kernel = load_panel_linear_kernel()
    if kernel is None or not kernel.bf16_available:
        pytest.skip("no AVX512-BF16 or no C compiler")
    out_features, in_features = shape
    generator = torch.Generator().manual_seed(rows + out_features)
    weight = torch.randn(out_features, in_features, generator=generator).bfloat16()
    bias = torch.randn(out_features, generator=generator)
    x = torch.randn(rows, in_features, generator=generator).bfloat16()
    panels = kernel.pack(weight)
    expected = x.double() @ weight.double().T + bias.double()
    ours = kernel(x, panels, out_features, bias, float32_out=True).double()  # bfloat16-rounded, as float32
    step = expected.abs().clamp(min=2.0 ** -100) * 2.0 ** -8  # one bfloat16 step, at most
    assert ((ours - expected).abs() <= step + 1e-4).all()
    assert torch.equal(kernel(x, panels, out_features, bias), ours.bfloat16())
    gate_up = torch.randn(rows, 2 * in_features, generator=generator).bfloat16()
    gate, up = gate_up[:, :in_features].float(), gate_up[:, in_features:].float()
    gated = (torch.nn.functional.silu(gate).bfloat16().float() * up).bfloat16().double()
    expected_gated = gated @ weight.double().T
    ours_gated = kernel(gate_up, panels, out_features, None, gated=True, float32_out=True).double()
    assert ((ours_gated - expected_gated).abs() <= expected_gated.abs() * 2.0 ** -8 + 1e-4).all()
    # Each output sums alone, k in order: the same values whatever else shares the call.
    assert torch.equal(kernel(x[:1], panels, out_features, bias), kernel(x, panels, out_features, bias)[:1])
