"""bfloat16 copies of quantized layers' weights for products of many rows, on CPUs that multiply
bfloat16 natively (AMX, or AVX512-BF16).

A quantized layer's kernel (int4_linear.c, int8_linear.c, gguf_columns.c) widens every weight for each
pass over the rows, so its cost grows with the rows; AMX multiplies bfloat16 tiles an order of
magnitude faster (oneDNN's product). Per layer on a 2-core Xeon VM with AMX, weights in cache:
SmolLM2's 3072 x 576 4-bit 0.11 / 0.18 / 0.21 / 0.38 ms at 4 / 8 / 16 / 32 rows against 0.09 /
0.09 / 0.09 / 0.12 ms for a bfloat16 copy through oneDNN. But a copy reads 2 bytes a weight where
4-bit reads ~0.6, and a decode step streams every weight from memory once: whole runs (`aqueduct
bench --model smollm2`, prompts 50-500, 128 tokens each, bfloat16, same VM) gave with copies from
8 rows 176 against 246 tokens/s without copies (8 requests); from 16 rows 244 against 254 (16
requests); from 24 rows 282 against 263 (24 requests) and 315-319 against 271 (32 requests). So
decode batches and prefill chunks of COPY_MIN_ROWS rows or more take the copy.

Without AMX, oneDNN's AVX512-BF16 product overtakes the quantized kernels from about 16 rows too
(SmolLM2's layers on a 2-core Zen 4 VM, in cache: 3072 x 576 4-bit 0.43 against 0.40 ms at 32 rows,
576 x 1536 0.40 against 0.20, the Q8_0 head 14.6 against 8.0 ms), and the engine's loop over the serve
benchmark's workload (`aqueduct bench --serve`'s 32 prompts, 128 tokens each, run in process)
took 16.0-17.2 s with copies from 24 rows against 18.2-18.6 s without (three alternating runs).

The copies cost memory (2 bytes a weight beside the quantized ones), so a model gets them only when
they fit the budget (`--bf16-copy-gib`), its dtype is bfloat16 and copies_pay(); results then
round as a bfloat16 model's product does (the copy holds the dequantized weights rounded to bfloat16,
as the dequantized path the layers take from 128 rows already does). A batch-invariant engine
(`--batch-invariant`, speculative decoding) makes none: a row's bits would depend on the batch.
4-bit layers where the process may use AMX take their many rows on AMX tiles instead (csrc/int4_amx.c:
as fast here, without the copy's memory).
Without AMX the copies also keep the panel kernel's layout where the budget holds both
(copy_panel_kernel): COPY_MIN_ROWS-64 rows then go through the panels, in the native decoder's one
call per decode step too (native_decode.py), and more rows through oneDNN.
"""

from __future__ import annotations

import os

import structlog
import torch
from torch import nn

from pipeline.model.cpu.kernels import PanelLinearKernel, load_panel_linear_kernel
from pipeline.model.cpu.library import cpu_flags
from pipeline.model.cpu.linear import PackedLinear, onednn_linear_works

log = structlog.get_logger(__name__)

# AQUEDUCT_BF16_COPY_MIN_ROWS: for measuring other limits
COPY_MIN_ROWS = int(os.environ.get("AQUEDUCT_BF16_COPY_MIN_ROWS", "24"))


def copies_pay() -> bool:
    """Whether the CPU multiplies bfloat16 fast enough for copies to win: AMX, or AVX512-BF16 (measured)."""
    if os.environ.get("AQUEDUCT_BF16_COPIES") == "amx":  # for measuring
        return "amx_bf16" in cpu_flags()
    return not cpu_flags().isdisjoint(("amx_bf16", "avx512_bf16"))


def copy_panel_kernel() -> PanelLinearKernel | None:
    """The panel kernel, for copies that keep its bfloat16 panels beside oneDNN's layout, where the panels
    take rows past COPY_MIN_ROWS (AVX512-BF16 without AMX, whose oneDNN product wins from 16 rows). A
    decode step of 24-64 rows then runs its layers in one native call (native_decode.py), and per
    layer the panels were as fast as oneDNN's product or faster (SmolLM2's 30 layers from memory, 2-core
    Zen 4 VM: 16 / 32 / 48 rows 13.6 / 23-24 / 31-34 ms against 16-17 / 24-25 / 34 ms)."""
    if "amx_bf16" in cpu_flags() or PackedLinear.PANEL_ROWS < COPY_MIN_ROWS:
        return None
    panel = load_panel_linear_kernel()
    return panel if panel is not None and panel.takes(torch.bfloat16) else None


def copy_takes(layer: nn.Module, rows: int, dtype: torch.dtype) -> bool:
    """Whether `rows` rows of `dtype` go through the layer's bfloat16 copy."""
    return rows >= COPY_MIN_ROWS and dtype == torch.bfloat16 and layer.__dict__.get("bf16_copy") is not None


def attach_bf16_copies(model: nn.Module, budget_bytes: int, layer_types: tuple[type, ...]) -> int:
    """Give each layer of `layer_types` (quantized layers with `dequantized()`) a bfloat16 copy when all
    copies together fit `budget_bytes`, with panels too where copy_panel_kernel() and the budget allow;
    returns how many were made (0 when they do not fit, or where oneDNN packs no bfloat16 weights: CPUs
    without AVX-512 or AVX-NE-CONVERT, which copies_pay() turns away before this is called)."""
    layers = [module for module in model.modules() if isinstance(module, layer_types)]
    if layers and not onednn_linear_works(torch.bfloat16):
        log.info("no bfloat16 copies of quantized weights: oneDNN has no bfloat16 product on this CPU")
        return 0
    needed = sum(layer.out_features * layer.in_features * 2 for layer in layers)  # oneDNN's layout
    panel = copy_panel_kernel()
    if panel is not None and 2 * needed > budget_bytes:  # panels too (2 bytes a weight more) only if they fit
        panel = None
    needed *= 2 if panel is not None else 1
    if not layers or needed > budget_bytes:
        if layers:
            log.info("no bfloat16 copies of quantized weights", needed_gib=round(needed / 2**30, 2),
                     budget_gib=round(budget_bytes / 2**30, 2))
        return 0
    for layer in layers:
        plain = nn.Linear(layer.in_features, layer.out_features, bias=layer.bias is not None)
        plain.weight = nn.Parameter(layer.dequantized().to(torch.bfloat16), requires_grad=False)
        if layer.bias is not None:
            plain.bias = nn.Parameter(layer.bias.detach().to(torch.bfloat16), requires_grad=False)
        # In __dict__, not as a submodule: walks over the model's modules (LoRA, packing, native decode)
        # should see the quantized layer only.
        layer.__dict__["bf16_copy"] = PackedLinear(plain, panel=panel)
    log.info("bfloat16 copies of quantized weights", layers=len(layers), gib=round(needed / 2**30, 2),
             from_rows=COPY_MIN_ROWS, panels=panel is not None)
    return len(layers)
