"""Which products of many rows leave the row-exact quantized kernels (AMX tiles, bfloat16 copies),
decided once a model's layers are in place (CPU only).

On CPUs with AMX: 4-bit layers multiply AMX_MIN_ROWS rows or more on AMX tiles themselves
(csrc/int4_amx.c), other quantized layers through bfloat16 copies within a budget (bf16_copies.py),
and bfloat16 panels stop at PackedLinear.AMX_PANEL_ROWS, oneDNN's AMX product taking more rows
(cpu/linear.py). CPUs with AVX512-BF16 but no AMX get the copies for every quantized layer, 4-bit
included (bf16_copies.py). Each sums in another order than the row-exact kernels, so a batch-invariant engine
(`--batch-invariant`, speculative decoding: docs/speculative.md) uses none of them.
"""

from __future__ import annotations

import torch
from torch import nn

from pipeline.model.cpu.kernels import QuantizedLinearKernel
from pipeline.model.cpu.linear import PackedLinear
from pipeline.model.layers.bf16_copies import COPY_MIN_ROWS, attach_bf16_copies, copies_pay
from pipeline.model.layers.gguf_linear import GgufLinear
from pipeline.model.layers.quantized_linear import AMX_MIN_ROWS, Int4Linear, Int8Linear


def route_many_rows(model: nn.Module, native: QuantizedLinearKernel | None, dtype: torch.dtype,
                    copy_budget_bytes: int, exact_rows: bool) -> None:
    """After quantize_linears and prepare_cpu_linears. native: the quantized layers' kernel (None: torch's
    kernels, which keep their own path); exact_rows: the engine is batch-invariant."""
    if exact_rows:
        for module in model.modules():
            if type(module) is Int4Linear:
                module.many_rows_on_amx = False
            elif type(module) is PackedLinear and module.panels is not None:
                module.panel_rows = PackedLinear.row_limit(module.weight_dtype)
        return
    if native is None or dtype != torch.bfloat16 or not copies_pay() or not copy_budget_bytes:
        return
    amx_first = native.int4_amx_available and AMX_MIN_ROWS <= COPY_MIN_ROWS  # 4-bit layers need no copies
    four_bit = () if amx_first else (Int4Linear,)
    attach_bf16_copies(model, copy_budget_bytes, (*four_bit, Int8Linear, GgufLinear))
