"""ctypes binding of csrc/gguf_linear.c: a linear layer whose weight stays in a GGUF file's blocks.

A layer's weight is one or more segments (rows of one GGUF type each, one after another), passed
to C as an array of `GgufSegment` ended by one with no rows; `segment_array` builds it.
"""

from __future__ import annotations

import ctypes
import functools

import torch

from pipeline.model.cpu.kernels import _address, _float32_bias, _io_mode, _linear_input
from pipeline.model.cpu.library import bind, pooled_library


class ColumnSegment(ctypes.Structure):
    """csrc/gguf_columns.h's ColumnSegment: rows of ggml type `type` held in column blocks."""

    _fields_ = [("type", ctypes.c_int64), ("values", ctypes.c_void_p), ("high", ctypes.c_void_p),
                ("halves", ctypes.c_void_p), ("bytes", ctypes.c_void_p), ("out_features", ctypes.c_int64)]


class GgufSegment(ctypes.Structure):
    """csrc/gguf_linear.c's Segment: `out_features` weight rows of ggml type `type`, the file's rows at
    `blocks` or column blocks at `columns`."""

    _fields_ = [("type", ctypes.c_int64), ("blocks", ctypes.c_void_p), ("columns", ctypes.POINTER(ColumnSegment)),
                ("out_features", ctypes.c_int64)]


def segment_array(segments: list[tuple]) -> ctypes.Array:
    """[(ggml type id, held[, rows])] -> the C array, ended by an empty segment. `held` is the file's rows
    (uint8 [rows, bytes per row]) or a layer's column-block buffers (gguf_columns.pack, with `rows`).
    The tensors must outlive the array (the layer holds both; the array holds its column descriptions)."""
    array = (GgufSegment * (len(segments) + 1))()
    array.column_segments = []  # kept alive with the array
    for entry, (qtype, held, *rows) in zip(array, segments, strict=False):
        entry.type, entry.out_features = qtype, rows[0] if rows else held.shape[0]
        if isinstance(held, dict):
            columns = ColumnSegment(qtype, held["values"].data_ptr(), _address(held.get("high")),
                                    held["halves"].data_ptr(), _address(held.get("bytes")), entry.out_features)
            array.column_segments.append(columns)
            entry.columns = ctypes.pointer(columns)
        else:
            entry.blocks = held.data_ptr()
    return array


class GgufLinearKernel:
    """y = x W^T + b with W as GGUF blocks, decoded to float32 and multiplied in float32 (csrc/gguf_linear.c)."""

    def __init__(self, library: ctypes.CDLL) -> None:
        p, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
        self._linear = bind(library, "gguf_linear", [p, p, p, p, i64, i64, i32, i32, i32], i32)
        self._dequantize = bind(library, "gguf_dequantize", [p, p, i64, i32, i32, i32], i32)
        self._rows = bind(library, "gguf_rows", [p, p, i64, p, i64, i32], i32)
        # Column blocks multiply faster than the file's rows only where the build has AVX-512.
        self.columns_fast = bool(bind(library, "gguf_columns_fast", [], i32)())
        self._scratch = torch.empty(0, dtype=torch.bfloat16)  # dequantized weights, one layer at a time

    def __call__(self, x: torch.Tensor, segments: ctypes.Array, out_features: int, in_features: int,
                 bias: torch.Tensor | None, gated: bool = False, float32_out: bool = False) -> torch.Tensor:
        """x [M, I] float32 or bfloat16 (others through float32) -> [M, O] in x's dtype.
        gated: x is [M, 2 I], a SiLU-gated MLP's [gate | up], and the input is silu(gate) * up.
        float32_out: [M, O] float32 holding what x's dtype would (the result's .float())."""
        x_in, io_bf16 = _linear_input(x)
        bias = _float32_bias(bias)  # held here until the call returns
        out = torch.empty(x_in.shape[0], out_features, dtype=torch.float32 if float32_out else x_in.dtype)
        failed = self._linear(out.data_ptr(), x_in.data_ptr(), ctypes.addressof(segments), _address(bias),
                              x_in.shape[0], in_features, _io_mode(io_bf16, float32_out), int(gated),
                              torch.get_num_threads())
        if failed == 1:
            raise ValueError(f"GGUF blocks: unknown type, or in_features {in_features} not a whole number of blocks")
        if failed:
            raise MemoryError("the GGUF linear kernel could not allocate its input buffer")
        return out if float32_out or out.dtype == x.dtype else out.to(x.dtype)

    def dequantize(self, segments: ctypes.Array, out: torch.Tensor, portable: bool = False) -> torch.Tensor:
        """The segments' rows decoded into `out` [O, I] float32 or bfloat16 (rounded to nearest even).
        portable: through the plain C decoders, not this CPU's vector ones (the same values; for tests)."""
        if out.dtype not in (torch.float32, torch.bfloat16) or not out.is_contiguous():
            raise ValueError(f"dequantized GGUF weights are contiguous float32 or bfloat16, not {out.dtype}")
        if self._dequantize(out.data_ptr(), ctypes.addressof(segments), out.shape[1], int(out.dtype == torch.bfloat16),
                            int(portable), torch.get_num_threads()):
            raise ValueError(f"GGUF blocks: unknown type, or in_features {out.shape[1]} not a whole number of blocks")
        return out

    def rows(self, segments: ctypes.Array, in_features: int, ids: torch.Tensor) -> torch.Tensor:
        """Rows `ids` (int64, each below the weight's rows: checked by the caller) as float32
        [len(ids), in_features], each value what dequantize() gives."""
        ids = ids.to(torch.int64).contiguous()
        out = torch.empty(ids.numel(), in_features)
        if self._rows(out.data_ptr(), ctypes.addressof(segments), in_features, ids.data_ptr(), ids.numel(),
                      torch.get_num_threads()):
            raise ValueError(f"GGUF blocks: unknown type, or in_features {in_features} not a whole number of blocks")
        return out

    def scratch(self, out_features: int, in_features: int, dtype: torch.dtype) -> torch.Tensor:
        """An [O, I] buffer of `dtype` this kernel reuses: valid until its next call, so for one layer's
        product at a time (the model runs layers in turn)."""
        needed = out_features * in_features * dtype.itemsize // 2  # in bfloat16 elements
        if self._scratch.numel() < needed:
            self._scratch = torch.empty(needed, dtype=torch.bfloat16)
        return self._scratch[:needed].view(dtype).view(out_features, in_features)


@functools.cache
def load_gguf_linear_kernel() -> GgufLinearKernel | None:
    library = pooled_library()
    return GgufLinearKernel(library) if library is not None else None
