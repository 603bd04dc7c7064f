"""CPU linear layers through oneDNN, with each weight reordered once at load time.

nn.Linear on CPU calls MKL's sgemm, which takes its AVX-512 kernels only on Intel CPUs. On an
AMD Zen 4 box (2 cores) oneDNN with a pre-packed weight ran the default model's matmuls
([T, 256] x [256, 1376], [T, 688] x [688, 256], [T, 256] x [256, 4096], T = 8..2048) 1.0-2.5x
as fast as MKL (the LM head gains most); only single rows on the smallest weight were slower
(21 vs 14 us).

Both accumulate in float32 but in different orders, so results differ from HF transformers'
(MKL) in the last bits: greedy tokens agree except at near-ties, as with any reordering.
`cpu_linear="torch"` keeps nn.Linear for bit-level comparisons.

For a few rows our few-rows kernel (csrc/few_rows_linear.c: each weight read once for all rows)
beats both. On an AMD EPYC (Zen 3, AVX2, 2 cores), SmolLM2's weights, 2 threads: 1.5-2x MKL's
float32 product for one row (the 49k-row LM head: 8.3 vs 16.3 ms, at the box's read bandwidth) and
up to 8x for 4 rows, where MKL takes a slow path; from about 8 rows on the packed weight won. On a
Zen 4 (AVX-512) oneDNN alone was about as fast as the kernel for a single linear, but the kernel is
what lets a decode step's layers run in one native call (native_decode.py): SmolLM2 decoded 2.1x
(float32) and 2.9-3.1x (bfloat16) faster with it than with oneDNN's per-op path (benchmarks/cpu_speed.py).
So `cpu_linear="auto"` (the default) keeps the plain weight beside the packed one (twice the linear
layers' weight memory) and sends 1-4 rows to the kernel, more to oneDNN; on CPUs with AVX-512 or AVX2,
float32 weights are kept as the panel kernel's panels instead of plainly (csrc/panel_linear.c), which take
1-256 rows (a decode batch) in one kernel per layer: as fast as the few-rows kernel for 1-4 rows,
faster than oneDNN up to 64 (SmolLM2's layers, Zen 5; figures in that file) and within 5% of it either
way from 64 to 256 (SmolLM2's and the 5M model's shapes, 2 threads, 2-core Zen 4 VM), so a decode step
of up to 256 sequences runs natively too (128 requests, float32, in process on that VM: the 5M model's
decode steps 2.2-2.5 s against 2.9 s, SmolLM2's 16.8 s against 19.6-21.9 s, with the layers run one by
one past 64 rows). Float32 weights that are all bfloat16 values (a bfloat16 or GGUF checkpoint run in
float32) keep panels of their high halves, which the kernel widens back to the same float32 values: the
same products bit for bit from half the bytes, so decode steps of few rows, which wait on memory, read
half as much (SmolLM2's 120 layers from memory, 2 threads, 2-core Zen 4 VM: 1 row 7.4 against 13.5 ms,
8 rows 10.3 against 14.7, 16 rows 18.6 against 21.3, 32 rows 35.2 against 36.7; its float32 batch
benchmark's decode steps of 12-29 rows 26.9-46.4 against 34.3-54.8 ms). On AVX2 (2-core Zen 3 VM, SmolLM2's
120 layers, bfloat16-valued float32 weights, 2 threads, best of 9, 1-3 runs) panels of halves took 15-19 ms
for 1-4 rows against 31-41 for the few-rows kernel and 67-76 for oneDNN, 28-32 ms for 8 rows against 46-59,
60-84 for 32 against 95-100, 119 for 64 against 175 (float32 panels: about oneDNN's time from 8 to 256
rows); at 512-2,048 rows oneDNN's product ran 1.2-2x the panels' rate, so prefill stays on it. That
box's float32 batch benchmark (docs/benchmarks.md) took 29.0-30.4 s against 39.5-42.5 s with the few-rows
kernel and oneDNN. bfloat16 weights get panels of their own where the CPU has AVX512-BF16 (k pairs
multiplied by VDPBF16PS), for 1-64 rows (beyond, oneDNN's product was 10-20% faster): SmolLM2 bfloat16
decoded 1.07-1.12x as fast for one sequence and 1.18-1.20x for 32 as with the few-rows kernel and oneDNN
(alternating runs, Zen 4).
Where the CPU has AMX, oneDNN's bfloat16 product runs on AMX tiles and overtakes the panels from a
few rows (SmolLM2's 3072 x 576, 2-core Xeon VM: 0.58 against 0.13 ms at 32 rows), so bfloat16 panels
take 1-16 rows there (AMX_PANEL_ROWS): `aqueduct bench --model smollm2 --quantization none --dtype
bfloat16` (prompts 50-500, 128 tokens), 32 requests 308 tokens/s against 246 with panels up to 64
rows (317 with 8), 8 requests 196 either way (188 with 8).
Where oneDNN cannot pack bfloat16 (AVX2 without AVX-NE-CONVERT), bfloat16 sends 1-8 rows to the
kernel and more to torch.

oneDNN builds and caches one primitive per input shape, ~0.6 MiB each whatever the weight size
(measured), and a step's row count takes any value up to the token budget: unpadded, a long run
grew the process by 0.9 GiB (5M model) and a sweep of row counts by several GiB, between the
cached primitives and the heap fragmentation of their churn. So inputs are padded with zero rows
to a few row counts (padded_row_count), which bounds the cache at 49 shapes per weight shape up
to 2048 rows, for at most 7 extra rows (up to 128) or 1/8 more rows (above). Up to 8 rows the
padding is a small per-layer buffer the rows are copied into (one copy, not F.pad's allocate, fill and
copy for every layer of every decode step); what its spare rows hold is irrelevant, since each
output row depends on its own input row only.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import structlog
import torch
import torch.nn.functional as F
from torch import nn

from pipeline.model.cpu.kernels import (
    FewRowsLinearKernel,
    PanelLinearKernel,
    load_few_rows_linear_kernel,
    load_panel_linear_kernel,
)
from pipeline.model.cpu.library import cpu_flags

log = structlog.get_logger(__name__)

_PACKABLE_DTYPES = (torch.float32, torch.bfloat16)
_BUFFERED_ROWS = 8  # inputs padded to this many rows (decode of 1-7 sequences) use the layer's buffer


class PackedLinear(nn.Module):
    """y = x W^T + b with W held in oneDNN's blocked layout (not a Parameter: not trainable)."""

    FEW_ROWS = 4  # float32 inputs up to this many rows take the few-rows kernel when one is given
    PANEL_ROWS = 64  # bfloat16 panels: 1 to this many rows take the panel kernel (oneDNN 10-20% faster beyond)
    # float32 panels: as fast as oneDNN's product to 256 rows (module docstring), so a decode step of up to
    # 256 sequences (twice max_num_seqs' default) runs its layers in one native call
    FLOAT32_PANEL_ROWS = 256
    # bfloat16 panels where the CPU has AMX, whose oneDNN product (AMX tiles) overtakes VDPBF16PS panels
    # from a few rows: AMX_PANEL_ROWS (module docstring)
    AMX_PANEL_ROWS = int(os.environ.get("AQUEDUCT_AMX_PANEL_ROWS", "16"))

    def __init__(self, linear: nn.Linear, few_rows: FewRowsLinearKernel | None = None,
                 panel: PanelLinearKernel | None = None) -> None:
        """few_rows: keep the plain weight too, for 1-FEW_ROWS rows through this kernel (module docstring).
        panel: weights it takes (float32; bfloat16 with AVX512-BF16) kept in its panel layout instead of
        the plain one, for 1 to row_limit(dtype) rows (AMX_PANEL_ROWS for bfloat16 where the CPU has AMX)."""
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight_dtype = linear.weight.dtype
        # batch-size hint None: the layout suits every row count (measured: within noise of a hint).
        self.packed_weight = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), None)
        self.bias = linear.bias
        self.panel = panel if panel is not None and panel.takes(linear.weight.dtype) else None
        # Float32 weights that are bfloat16 values (a bfloat16 or GGUF checkpoint run in float32) keep half
        # the bytes, widened in the kernel to the same products (module docstring).
        halves = self.panel.pack_halves(linear.weight) if self.panel is not None else None
        self.panels = halves if halves is not None or self.panel is None else self.panel.pack(linear.weight)
        amx = linear.weight.dtype == torch.bfloat16 and "amx_bf16" in cpu_flags()
        self.panel_rows = self.AMX_PANEL_ROWS if amx else self.row_limit(linear.weight.dtype)
        self.few_rows = few_rows if self.panel is None else None
        self.plain_weight = linear.weight.detach() if self.few_rows is not None else None
        self._small_rows = torch.zeros(_BUFFERED_ROWS, self.in_features, dtype=linear.weight.dtype)

    @classmethod
    def row_limit(cls, dtype: torch.dtype) -> int:
        """The most rows the panels of a `dtype` weight take where oneDNN's product is not AMX's."""
        return cls.FLOAT32_PANEL_ROWS if dtype == torch.float32 else cls.PANEL_ROWS

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        num_rows = rows.shape[0]
        if (direct := self._direct(rows)) is not None:
            return direct.view(*x.shape[:-1], self.out_features)
        padded = padded_row_count(num_rows)
        if padded != num_rows and padded == _BUFFERED_ROWS and rows.dtype == self._small_rows.dtype:
            self._small_rows[:num_rows].copy_(rows)
            rows = self._small_rows
        elif padded != num_rows:
            rows = F.pad(rows, (0, 0, 0, padded - num_rows))  # zero rows; their outputs are dropped
        out = torch.ops.mkldnn._linear_pointwise(rows, self.packed_weight, self.bias, "none", [], "")
        return out[:num_rows].view(*x.shape[:-1], self.out_features)

    def forward_gated(self, gate_up: torch.Tensor) -> torch.Tensor | None:
        """self(silu(gate) * up) from a gated MLP's [gate | up] in one kernel call (few rows only), else None."""
        direct = self._direct(gate_up.reshape(-1, 2 * self.in_features), gated=True)
        return direct.view(*gate_up.shape[:-1], self.out_features) if direct is not None else None

    def forward_float32(self, x: torch.Tensor) -> torch.Tensor | None:
        """self(x).float() in one kernel call (an LM head's logits; few rows only), else None."""
        direct = self._direct(x.reshape(-1, self.in_features), float32_out=True)
        return direct.view(*x.shape[:-1], self.out_features) if direct is not None else None

    def _direct(self, rows: torch.Tensor, gated: bool = False, float32_out: bool = False) -> torch.Tensor | None:
        """The product through the panel or few-rows kernel when one takes this many rows, else None."""
        num_rows = rows.shape[0]
        if self.panel is not None and 0 < num_rows <= self.panel_rows:
            return self.panel(rows, self.panels, self.out_features, self.bias, gated=gated, float32_out=float32_out)
        if self.few_rows is not None and 0 < num_rows <= self.FEW_ROWS:
            return self.few_rows(rows, self.plain_weight, self.bias, gated=gated, float32_out=float32_out)
        return None

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"few_rows={self.few_rows is not None}, panels={self.panels is not None}")


class FewRowsLinear(nn.Module):
    """nn.Linear whose 1-8 row inputs go through the few-rows kernel (for weights oneDNN cannot pack here)."""

    def __init__(self, linear: nn.Linear, few_rows: FewRowsLinearKernel) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias, self.few_rows = linear.weight, linear.bias, few_rows

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        if not 0 < rows.shape[0] <= self.few_rows.MAX_ROWS:
            return F.linear(x, self.weight, self.bias)
        return self.few_rows(rows, self.weight, self.bias).view(*x.shape[:-1], self.out_features)  # reads data_ptr

    def forward_gated(self, gate_up: torch.Tensor) -> torch.Tensor | None:
        """self(silu(gate) * up) from a gated MLP's [gate | up] in one kernel call (1-8 rows), else None."""
        rows = gate_up.reshape(-1, 2 * self.in_features)
        if not 0 < rows.shape[0] <= self.few_rows.MAX_ROWS:
            return None
        return self.few_rows(rows, self.weight, self.bias, gated=True).view(*gate_up.shape[:-1], self.out_features)

    def forward_float32(self, x: torch.Tensor) -> torch.Tensor | None:
        """self(x).float() in one kernel call (an LM head's logits; 1-8 rows), else None."""
        rows = x.reshape(-1, self.in_features)
        if not 0 < rows.shape[0] <= self.few_rows.MAX_ROWS:
            return None
        return self.few_rows(rows, self.weight, self.bias, float32_out=True).view(*x.shape[:-1], self.out_features)


def few_rows_kernel_for(cpu_linear: str, dtype: torch.dtype) -> FewRowsLinearKernel | None:
    """The few-rows kernel when `cpu_linear` uses it (auto; module docstring) and a C compiler built it."""
    if cpu_linear != "auto" or dtype not in (torch.float32, torch.bfloat16):
        return None
    return load_few_rows_linear_kernel()


def prepare_cpu_linears(model: nn.Module, cpu_linear: str, dtype: torch.dtype) -> dict[str, int]:
    """Swap `model`'s nn.Linear layers for the CPU paths `cpu_linear` picks on this CPU; returns counts."""
    few_rows = few_rows_kernel_for(cpu_linear, dtype)
    if cpu_linear in ("auto", "onednn") and onednn_linear_works(dtype):
        panel = load_panel_linear_kernel() if few_rows is not None else None
        return {"packed": pack_linears(model, few_rows, panel), "with_few_rows_path": int(few_rows is not None),
                "with_panels": int(panel is not None and panel.takes(dtype))}
    if few_rows is not None:
        return {"few_rows": _replace_linears(model, lambda linear: FewRowsLinear(linear, few_rows))}
    return {}


def padded_row_count(rows: int) -> int:
    """`rows` rounded up to a multiple of 8, or of an eighth of its power-of-two range above 128.

    1..8 -> 8, 100 -> 104, 129 -> 144 (step 16 in (128, 256]), 2000 -> 2048 (step 128 in
    (1024, 2048]): 16 values up to 128, then 8 per doubling; at most 7 padding rows up to 128,
    at most 1/8 of the rows above.
    """
    if rows <= 128:
        return -(-rows // 8) * 8
    step = 1 << ((rows - 1).bit_length() - 4)  # (128, 256] -> 16, (256, 512] -> 32, ...
    return -(-rows // step) * step


def onednn_linear_works(dtype: torch.dtype) -> bool:
    """Whether this torch build packs and runs oneDNN linears in `dtype` (and agrees with F.linear)."""
    if dtype not in _PACKABLE_DTYPES or not torch.backends.mkldnn.is_available():
        return False
    try:
        generator = torch.Generator().manual_seed(0)
        linear = nn.Linear(32, 24, dtype=dtype)
        x = torch.randn(5, 32, generator=generator).to(dtype)
        with torch.no_grad():
            ours, reference = PackedLinear(linear)(x), F.linear(x, linear.weight, linear.bias)
    except (RuntimeError, AttributeError) as error:  # op missing or unsupported on this CPU
        log.info("oneDNN linear unavailable; using torch's", dtype=str(dtype), error=str(error))
        return False
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    return ours.shape == reference.shape and torch.allclose(ours.float(), reference.float(), atol=tolerance,
                                                            rtol=tolerance)


def pack_linears(model: nn.Module, few_rows: FewRowsLinearKernel | None = None,
                 panel: PanelLinearKernel | None = None) -> int:
    """Replace every nn.Linear in `model` by a PackedLinear of the same weights; returns how many.

    A weight tied to another module (lm_head and embed_tokens) is copied into the packed layout;
    the other module keeps the original.
    """
    return _replace_linears(model, lambda linear: PackedLinear(linear, few_rows, panel))


def _replace_linears(model: nn.Module, make: Callable[[nn.Linear], nn.Module]) -> int:
    """Replace each nn.Linear by make(it), holding the layers by name only, so each replaced
    layer's weight is freed before the next layer is made and the allocator hands its memory to
    the next new layout instead of faulting in fresh pages. SmolLM2 float32 (2-core Zen 4 VM):
    263k -> 175k page faults, packing 0.8-1.1 -> 0.5-0.6 s, and ~350 MB less at the peak."""
    names = [name for name, module in model.named_modules(remove_duplicate=False) if type(module) is nn.Linear]
    for name in names:
        parent_name, _, child_name = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        setattr(parent, child_name, make(getattr(parent, child_name)))
    return len(names)
