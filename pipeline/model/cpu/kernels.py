"""Native CPU kernels (built by library.py on first use): paged decode attention
(csrc/paged_decode_attention.c), the rotary embedding fused with the KV cache write
(csrc/rope_kv_write.c), linear layers for a few rows (csrc/few_rows_linear.c), weight-only
quantized linear layers (csrc/int8_linear.c, csrc/int4_linear.c), RMSNorm (csrc/rms_norm.c), and all of them
chained into whole decoder layers (csrc/decoder_layers.c, used by native_decode.py).

They are plain C, loaded through ctypes, so building takes about a second and needs no torch
headers. They share one library with the thread pool they run on (csrc/thread_pool.c). When no
compiler is available, or AQUEDUCT_CPU_KERNEL=0, the loaders return None and the model stays on
the portable torch path.
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any

import torch

from pipeline.model.cpu.library import bind, pooled_library

# kv_format of the unquantized caches the kernel reads in place (fp8 callers pass 1 or 2 themselves,
# attention/fp8_kv.py KERNEL_FORMATS, with the layer's scales).
_FORMATS: dict[torch.dtype, int] = {torch.float32: 0, torch.bfloat16: 3}


class DecodeKernel:
    def __init__(self, library: ctypes.CDLL) -> None:
        p, i64, f32, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float, ctypes.c_int
        self._fn = bind(library, "paged_decode_attention",
                         [p, p, p, p, p, i64, p, i64, i64, i64, i64, i64, f32, i64, i64, i64, f32, p, i32, f32, f32,
                          i32, i32], i32)

    def __call__(self, q: torch.Tensor, kv_cache: torch.Tensor, block_tables: torch.Tensor,
                 seq_lens: torch.Tensor, max_seq_len: int, scale: float, window: int = 0, chunk: int = 0,
                 softcap: float = 0.0, kv_format: int = 0, k_scale: float = 1.0,
                 v_scale: float = 1.0, sinks: torch.Tensor | None = None) -> torch.Tensor:
        """q [B, H, D] float32 or bfloat16 (others through float32) -> out [B, H, D] in q's dtype (the
        kernel computes in float32);
        kv_cache [2, N, block_size, H_kv, D] float32 or bfloat16, or fp8 (kv_format 1 = e4m3,
        2 = e5m2) whose values are byte * k_scale / v_scale; block_tables [B, M] int32 and
        seq_lens [B] int32, all contiguous on the CPU.
        window > 0: attend to the last `window` tokens only; chunk > 0: to the last token's chunk of
        `chunk` positions only (Llama 4's chunked attention); softcap > 0: Gemma 2's soft-capping;
        sinks [H]: gpt-oss's attention sink logits (in the softmax denominator only)."""
        kv_format = kv_format or _FORMATS.get(kv_cache.dtype, -1)
        if kv_format < 0 or (kv_format in (1, 2) and kv_cache.element_size() != 1):
            raise ValueError(f"the CPU decode kernel reads float32, bfloat16 or fp8 K/V, got {kv_cache.dtype}")
        io_bf16 = q.dtype == torch.bfloat16
        q_in = (q if io_bf16 or q.dtype == torch.float32 else q.float()).contiguous()
        out = torch.empty_like(q_in)
        num_seqs, num_heads, head_dim = q.shape
        _, _, block_size, num_kv_heads, _ = kv_cache.shape
        key_ptr, value_ptr = _halves(kv_cache)
        sinks_f32 = sinks.float().contiguous() if sinks is not None else None  # held until the call returns
        failed = self._fn(out.data_ptr(), q_in.data_ptr(), key_ptr, value_ptr,
                          block_tables.data_ptr(), block_tables.shape[1], seq_lens.data_ptr(),
                          num_seqs, num_heads, num_kv_heads, head_dim, block_size, scale, max_seq_len,
                          window, chunk, softcap, _address(sinks_f32), kv_format, k_scale, v_scale, int(io_bf16),
                          torch.get_num_threads())
        if failed:
            raise MemoryError("paged decode attention kernel could not allocate its scratch buffers")
        return out if out.dtype == q.dtype else out.to(q.dtype)


class RopeKVKernel:
    """Rotate q and k in place in a step's qkv rows and write k, v into the cache (csrc/rope_kv_write.c)."""

    def __init__(self, library: ctypes.CDLL) -> None:
        p, i64 = ctypes.c_void_p, ctypes.c_int64
        self._fn = bind(library, "rope_kv_write", [p, p, p, p, p, p, i64, i64, i64, i64, i64, ctypes.c_int], None)

    def __call__(self, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv_cache: torch.Tensor,
                 slots: torch.Tensor, num_heads: int, num_kv_heads: int, head_dim: int) -> None:
        """qkv [T, (H + 2 H_kv) D] contiguous; cos, sin [T, 1, D / 2] contiguous, qkv's dtype (float32 or
        bfloat16, the cache's too); slots [T] int64 (< 0: not written)."""
        key_ptr, value_ptr = _halves(kv_cache)
        self._fn(qkv.data_ptr(), cos.data_ptr(), sin.data_ptr(), key_ptr, value_ptr, slots.data_ptr(),
                 qkv.shape[0], num_heads, num_kv_heads, head_dim, qkv.element_size(), torch.get_num_threads())

    @staticmethod
    def applies(qkv: torch.Tensor, cos: torch.Tensor, kv_cache: torch.Tensor, slots: torch.Tensor) -> bool:
        return (qkv.dtype in (torch.float32, torch.bfloat16) and qkv.dtype == cos.dtype == kv_cache.dtype
                and qkv.is_contiguous() and cos.is_contiguous() and kv_cache.is_contiguous()
                and slots.dtype == torch.int64 and slots.shape[0] == qkv.shape[0] and qkv.device.type == "cpu")


class FewRowsLinearKernel:
    """y = x W^T + b for 1-8 rows of x, W float32 or bfloat16 (csrc/few_rows_linear.c)."""

    MAX_ROWS = 8

    def __init__(self, library: ctypes.CDLL) -> None:
        p, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
        self._fn = bind(library, "few_rows_linear", [p, p, p, p, i64, i64, i64, i32, i32, i32, i32], i32)

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                 gated: bool = False, float32_out: bool = False) -> torch.Tensor:
        """x [M, I] (M <= 8) float32 or bfloat16 (other dtypes go through float32), weight [O, I]
        contiguous float32 or bfloat16, bias [O] or None -> [M, O] in x's dtype; sums in float32.
        gated: x is [M, 2 I], a SiLU-gated MLP's [gate | up], and the input is silu(gate) * up.
        float32_out: [M, O] float32 holding what x's dtype would (the result's .float())."""
        rows = x.shape[0]
        x_in, io_bf16 = _linear_input(x)
        bias = _float32_bias(bias)  # held here until the call returns
        out = torch.empty(rows, weight.shape[0], dtype=torch.float32 if float32_out else x_in.dtype)
        failed = self._fn(out.data_ptr(), x_in.data_ptr(), weight.data_ptr(), _address(bias), rows,
                          weight.shape[0], weight.shape[1], int(weight.dtype == torch.bfloat16),
                          _io_mode(io_bf16, float32_out), int(gated), torch.get_num_threads())
        if failed == 1:
            raise ValueError(f"the few-rows linear kernel takes 1-{self.MAX_ROWS} rows, got {rows}")
        if failed:
            raise MemoryError("the few-rows linear kernel could not allocate its scratch buffer")
        return out if float32_out or out.dtype == x.dtype else out.to(x.dtype)


class PanelLinearKernel:
    """y = x W^T + b for a batch of rows, W repacked into panels (csrc/panel_linear.c; AVX-512 or AVX2):
    float32 weights, and bfloat16 ones where the CPU has AVX512-BF16 (`bf16_available`). Float32
    weights that are all bfloat16 values can be packed as their halves instead (pack_halves): an int32
    tensor of half the bytes, widened back in the kernel (the same products, bit for bit)."""

    def __init__(self, library: ctypes.CDLL) -> None:
        p, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
        # panels' dtype -> the kernel's suffix (int32: float32 weights held as bfloat16 halves)
        suffixes = {torch.float32: "", torch.bfloat16: "_bf16", torch.int32: "_wide"}
        self._size = {dtype: bind(library, f"panel_linear{suffix}_packed_size", [i64, i64], i64)
                      for dtype, suffix in suffixes.items()}
        self._pack = {dtype: bind(library, f"pack_panels{suffix}", [p, p, i64, i64], i32 if suffix == "_wide" else None)
                      for dtype, suffix in suffixes.items()}
        self._fn = {dtype: bind(library, f"panel_linear{suffix}", [p, p, p, p, i64, i64, i64, i32, i32, i32], i32)
                    for dtype, suffix in suffixes.items()}
        self.bf16_available = bool(bind(library, "panel_linear_bf16_available", [], i32)())

    def takes(self, dtype: torch.dtype) -> bool:
        return dtype == torch.float32 or (dtype == torch.bfloat16 and self.bf16_available)

    def pack(self, weight: torch.Tensor) -> torch.Tensor:
        """weight [O, I] float32 or bfloat16 -> its panels (a flat tensor of its dtype), once at load."""
        weight = weight.detach().contiguous()
        out_features, in_features = weight.shape
        panels = torch.empty(self._size[weight.dtype](out_features, in_features), dtype=weight.dtype)
        self._pack[weight.dtype](panels.data_ptr(), weight.data_ptr(), out_features, in_features)
        return panels

    def pack_halves(self, weight: torch.Tensor) -> torch.Tensor | None:
        """float32 weight [O, I] -> int32 panels of its values' high halves, or None where some value is not
        a bfloat16 value (its low 16 bits not all zero), once at load."""
        if weight.dtype != torch.float32:
            return None
        weight = weight.detach().contiguous()
        out_features, in_features = weight.shape
        panels = torch.empty(self._size[torch.int32](out_features, in_features), dtype=torch.int32)
        exact = self._pack[torch.int32](panels.data_ptr(), weight.data_ptr(), out_features, in_features)
        return panels if exact else None

    def __call__(self, x: torch.Tensor, panels: torch.Tensor, out_features: int, bias: torch.Tensor | None,
                 gated: bool = False, float32_out: bool = False) -> torch.Tensor:
        """x [M, I] float32 or bfloat16 (others through float32) -> [M, O] in x's dtype (float32 with
        float32_out); gated as FewRowsLinearKernel's."""
        rows, in_features = x.shape[0], x.shape[1] // (2 if gated else 1)
        x_in, io_bf16 = _linear_input(x)
        bias = _float32_bias(bias)
        out = torch.empty(rows, out_features, dtype=torch.float32 if float32_out else x_in.dtype)
        failed = self._fn[panels.dtype](out.data_ptr(), x_in.data_ptr(), panels.data_ptr(), _address(bias), rows,
                                        out_features, in_features, _io_mode(io_bf16, float32_out), int(gated),
                                        torch.get_num_threads())
        if failed == 1:
            raise ValueError(f"the panel linear kernel takes 1 or more rows on an AVX-512 or AVX2 CPU (AVX512-BF16 for "
                             f"bfloat16 panels), got {rows} rows")
        if failed:
            raise MemoryError("the panel linear kernel could not allocate its scratch buffer")
        return out if out.dtype == x.dtype or float32_out else out.to(x.dtype)


class QuantizedLinearKernel:
    """y = x W^T + b with W kept as 4-bit groups (csrc/int4_linear.c) or int8 with per-row scales
    (csrc/int8_linear.c), both in blocks of 16 output columns."""

    def __init__(self, library: ctypes.CDLL) -> None:
        p, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
        self._int4 = bind(library, "quantized_linear_int4", [p, p, p, p, p, i64, i64, i64, i32, i32, i32], i32)
        self._int8 = bind(library, "quantized_linear_int8", [p, p, p, p, p, i64, i64, i64, i32, i32, i32], i32)
        self._dequantize_int4 = bind(library, "dequantize_int4", [p, p, p, i64, i64, i32, i32], i32)
        self._dequantize_int8 = bind(library, "dequantize_int8", [p, p, p, i64, i64, i32, i32], None)
        self._int4_amx = bind(library, "int4_amx_linear", [p, p, p, p, p, i64, i64, i64, i32, i32], i32)
        # Whether 4-bit products of many bfloat16 rows can run on AMX tiles (csrc/int4_amx.c).
        self.int4_amx_available = bool(bind(library, "int4_amx_available", [], i32)())
        self._scratch = torch.empty(0, dtype=torch.bfloat16)  # dequantized weights, one layer at a time

    def int4(self, x: torch.Tensor, column_blocks: torch.Tensor, block_scales: torch.Tensor, out_features: int,
             bias: torch.Tensor | None, gated: bool = False, float32_out: bool = False) -> torch.Tensor:
        """x [M, I] float32 or bfloat16 (others through float32); column_blocks [ceil(O / 16), I * 8] uint8
        and block_scales [ceil(O / 16), I / 32, 2, 16] float16 in the kernel's layout (csrc/int4_linear.c)
        -> [M, O] in x's dtype.
        gated: x is [M, 2 I], a SiLU-gated MLP's [gate | up], and the input is silu(gate) * up.
        float32_out: [M, O] float32 holding what x's dtype would (the result's .float())."""
        return self._run(self._int4, x, column_blocks, block_scales, bias, out_features, column_blocks.shape[1] // 8,
                         gated, float32_out)

    def int4_amx(self, x: torch.Tensor, column_blocks: torch.Tensor, block_scales: torch.Tensor, out_features: int,
                 bias: torch.Tensor | None, gated: bool = False) -> torch.Tensor:
        """As int4 for bfloat16 rows, the weights widened to bfloat16 and multiplied on AMX tiles
        (csrc/int4_amx.c; int4_amx_available says whether it can run). gated as int4's."""
        rows = x.contiguous()
        bias = _float32_bias(bias)
        out = torch.empty(rows.shape[0], out_features, dtype=torch.bfloat16)
        in_features = rows.shape[1] // 2 if gated else rows.shape[1]
        failed = self._int4_amx(out.data_ptr(), rows.data_ptr(), column_blocks.data_ptr(), block_scales.data_ptr(),
                                _address(bias), rows.shape[0], out_features, in_features, int(gated),
                                torch.get_num_threads())
        if failed == 2:
            raise MemoryError("the AMX 4-bit kernel could not allocate its gated rows")
        if failed:
            raise ValueError(f"the AMX 4-bit kernel could not run (code {failed}) for {tuple(rows.shape)} rows")
        return out

    def int8(self, x: torch.Tensor, column_blocks: torch.Tensor, scales: torch.Tensor, out_features: int,
             in_features: int, bias: torch.Tensor | None, gated: bool = False,
             float32_out: bool = False) -> torch.Tensor:
        """x [M, I]; column_blocks [ceil(O / 16), ceil(I / 32) * 512] int8 and scales [ceil(O / 16) * 16]
        float32 in the kernel's layout (csrc/int8_linear.c) -> [M, O] in x's dtype; gated and float32_out
        as int4."""
        return self._run(self._int8, x, column_blocks, scales, bias, out_features, in_features, gated, float32_out)

    def dequantize_int4(self, column_blocks: torch.Tensor, block_scales: torch.Tensor, out_features: int,
                        dtype: torch.dtype) -> torch.Tensor:
        """The plain [O, I] weight (float32 or bfloat16; columns [0, out_features) of the blocks) in a
        scratch buffer this kernel reuses: valid until its next call, so for one layer's product at a time
        (the model runs layers in turn)."""
        out = self._scratch_for(out_features, column_blocks.shape[1] // 8, dtype)
        if self._dequantize_int4(out.data_ptr(), column_blocks.data_ptr(), block_scales.data_ptr(), out.shape[0],
                                 out.shape[1], int(dtype == torch.bfloat16), torch.get_num_threads()):
            raise ValueError(f"4-bit weights need in_features divisible by 32, got {out.shape[1]}")
        return out

    def dequantize_int8(self, column_blocks: torch.Tensor, scales: torch.Tensor, out_features: int,
                        in_features: int, dtype: torch.dtype) -> torch.Tensor:
        """As dequantize_int4, for int8 blocks with float32 scales."""
        out = self._scratch_for(out_features, in_features, dtype)
        self._dequantize_int8(out.data_ptr(), column_blocks.data_ptr(), scales.data_ptr(), out.shape[0], out.shape[1],
                              int(dtype == torch.bfloat16), torch.get_num_threads())
        return out

    def _scratch_for(self, out_features: int, in_features: int, dtype: torch.dtype) -> torch.Tensor:
        if dtype not in (torch.float32, torch.bfloat16):
            raise ValueError(f"dequantized weights are float32 or bfloat16, not {dtype}")
        needed = out_features * in_features * dtype.itemsize // 2  # in bfloat16 elements
        if self._scratch.numel() < needed:
            self._scratch = torch.empty(needed, dtype=torch.bfloat16)
        return self._scratch[:needed].view(dtype).view(out_features, in_features)

    @staticmethod
    def _run(function: Any, x: torch.Tensor, values: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None,
             out_features: int, in_features: int, gated: bool, float32_out: bool) -> torch.Tensor:
        x_in, io_bf16 = _linear_input(x)
        bias = _float32_bias(bias)  # held here until the call returns
        out = torch.empty(x_in.shape[0], out_features, dtype=torch.float32 if float32_out else x_in.dtype)
        failed = function(out.data_ptr(), x_in.data_ptr(), values.data_ptr(), scales.data_ptr(), _address(bias),
                          x_in.shape[0], out_features, in_features, _io_mode(io_bf16, float32_out), int(gated),
                          torch.get_num_threads())
        if failed == 1:
            raise ValueError(f"4-bit weights need in_features divisible by 32 (and at most 65536), got {in_features}")
        if failed:
            raise MemoryError("the quantized linear kernel could not allocate its scratch buffers")
        return out if float32_out or out.dtype == x.dtype else out.to(x.dtype)


class RMSNormKernel:
    """Llama's RMSNorm over a step's rows in one call (csrc/rms_norm.c)."""

    def __init__(self, library: ctypes.CDLL) -> None:
        p, i64 = ctypes.c_void_p, ctypes.c_int64
        self._fn = bind(library, "rms_norm", [p, p, p, i64, i64, ctypes.c_float, ctypes.c_int, ctypes.c_int], None)

    @staticmethod
    def applies(x: torch.Tensor, weight: torch.Tensor) -> bool:
        return (x.dtype in (torch.float32, torch.bfloat16) and weight.dtype == x.dtype and x.device.type == "cpu"
                and x.is_contiguous() and weight.is_contiguous())

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        out = torch.empty_like(x)
        self._fn(out.data_ptr(), x.data_ptr(), weight.data_ptr(), x.numel() // x.shape[-1], x.shape[-1], eps,
                 int(x.dtype == torch.bfloat16), torch.get_num_threads())
        return out


def _linear_input(x: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """A linear kernel's rows: bfloat16 as they are, any other dtype as float32; contiguous. And
    whether they are bfloat16 (the kernel then writes bfloat16 too)."""
    io_bf16 = x.dtype == torch.bfloat16
    return (x if io_bf16 else x.float()).contiguous(), io_bf16


def _io_mode(io_bf16: bool, float32_out: bool) -> int:
    """A linear kernel's io_bf16 argument (csrc/bf16.h): 0 float32, 1 bfloat16, 2 bfloat16 in, float32 out."""
    return (2 if float32_out else 1) if io_bf16 else 0


def _float32_bias(bias: torch.Tensor | None) -> torch.Tensor | None:
    """`bias` as the kernels read it: contiguous float32 (a copy only when it is not already)."""
    if bias is None or (bias.dtype == torch.float32 and bias.is_contiguous()):
        return bias
    return bias.float().contiguous()


def _address(tensor: torch.Tensor | None) -> int | None:
    return tensor.data_ptr() if tensor is not None else None


def _halves(kv_cache: torch.Tensor) -> tuple[int, int]:
    """Addresses of kv_cache[0] (K) and kv_cache[1] (V), without two indexing ops per layer."""
    start = kv_cache.data_ptr()
    return start, start + kv_cache.stride(0) * kv_cache.element_size()


@functools.cache
def load_decode_kernel() -> DecodeKernel | None:
    library = pooled_library()
    return DecodeKernel(library) if library is not None else None


@functools.cache
def load_few_rows_linear_kernel() -> FewRowsLinearKernel | None:
    library = pooled_library()
    return FewRowsLinearKernel(library) if library is not None else None


@functools.cache
def load_panel_linear_kernel() -> PanelLinearKernel | None:
    """The panel kernel where this CPU runs it (AVX-512 or AVX2, and a C compiler), else None."""
    library = pooled_library()
    if library is None or not bind(library, "panel_linear_available", [], ctypes.c_int)():
        return None
    return PanelLinearKernel(library)


@functools.cache
def load_quantized_linear_kernel() -> QuantizedLinearKernel | None:
    library = pooled_library()
    return QuantizedLinearKernel(library) if library is not None else None


@functools.cache
def load_decoder_layers() -> Any:
    """csrc/decoder_layers.c's entry point (native_decode.py declares its structures), or None."""
    library = pooled_library()
    if library is None:
        return None
    p = ctypes.c_void_p
    return bind(library, "decoder_layers", [p, p, ctypes.c_int64, p], ctypes.c_int)


@functools.cache
def load_rms_norm_kernel() -> RMSNormKernel | None:
    library = pooled_library()
    return RMSNormKernel(library) if library is not None else None


@functools.cache
def load_rope_kv_kernel() -> RopeKVKernel | None:
    library = pooled_library()
    return RopeKVKernel(library) if library is not None else None
