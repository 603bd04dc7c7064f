"""A linear layer whose weight stays in its GGUF file's types: Q4_K, Q5_K, Q6_K, Q5_0, Q8_0 (and
Q4_0/Q4_1 when a fused weight mixes them with those).

Where the native kernels are built with AVX-512, the Q5_0, Q8_0 and K-quant parts are held in column
blocks (gguf_columns.py, csrc/gguf_columns.c): each weight's q and its block's scales as the file has
them, 16 output columns side by side, multiplied in integers by inputs quantized to int16 per group
of 32 as the 4-bit kernel does (about the file's bytes; 2.5-3.7x faster a row than float products).
Elsewhere, and for Q4_0/Q4_1 parts, the layer holds the file's rows, decoded to float32 exactly as
gguf-py dequantizes them and multiplied in float32 (csrc/gguf_linear.c). A fused weight (qkv_proj,
gate_up_proj) may join parts of different types, e.g. a Q4_K_M file's Q4_K q/k rows and Q6_K v rows:
each part is a segment of its own type.

Many rows at once (a prefill) multiply faster by the weight dequantized into a scratch buffer
(float32, or bfloat16 for bfloat16 inputs) with torch, up to 2^24 weights at a time: from
dequantize_min_rows(dtype) rows on. Below that, a row's result is bit for bit the same whatever
other rows share the call. Measured with the file's rows on a 5632 x 1024 Q4_K weight, 2 threads,
Zen 4 (kernel vs dequantize + product): float32 16.5 vs 41 ms at 32 rows, 32 vs 44 at 64, 74 vs 75
at 128; bfloat16 14.2 vs 12.9 at 32, 30 vs 17.5 at 64, 65 vs 13 at 128 (oneDNN's bfloat16 product
with AVX512-BF16; CPUs without bfloat16 arithmetic keep the kernel, as quantized_linear.py's layers
do). With column blocks, 2-core Xeon VM: Q4_K 5632 x 1024 float32 1.4 vs 3.9 ms at 32 rows, 3.0 vs
4.6 at 64, 6.2 vs 6.8 at 128, 12.9 vs 11.7 at 256; bfloat16 2.1 vs 4.0 at 32, 2.9 vs 3.7 at 64, 5.7
vs 4.0 at 128 (Q5_0 1536 x 576 and Q6_K 1024 x 4096 alike: bfloat16 crosses between 32 and 64 rows,
float32 about 128).
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType
from torch import nn

from pipeline.model.cpu.gguf_kernel import GgufLinearKernel, segment_array
from pipeline.model.cpu.library import cpu_has_bfloat16_arithmetic
from pipeline.model.layers import gguf_columns
from pipeline.model.layers.bf16_copies import copy_takes
from pipeline.model.layers.gguf_columns import BLOCK_COLUMNS

# ggml's (weights, bytes) per block of the types the kernel reads.
GGUF_KERNEL_TYPES: dict[str, tuple[int, int]] = {
    "Q4_0": (32, 18), "Q4_1": (32, 20), "Q5_0": (32, 22), "Q8_0": (32, 34),
    "Q4_K": (256, 144), "Q5_K": (256, 176), "Q6_K": (256, 210),
}
# Rows from which a product goes through the dequantized weight (module docstring); other dtypes
# compute in float32. Column blocks' integer products stay ahead longer in bfloat16.
_DEQUANTIZE_MIN_ROWS = {torch.float32: 128, torch.bfloat16: 32}
_COLUMNS_DEQUANTIZE_MIN_ROWS = {torch.float32: 128, torch.bfloat16: 64}
ALWAYS_KERNEL = 1 << 30
_DEQUANTIZE_CHUNK = 1 << 24  # weights dequantized at a time: the scratch stays within 64 MiB


def dequantize_min_rows(dtype: torch.dtype, columns: bool = False) -> int:
    """The fewest rows of `dtype` that a GgufLinear multiplies by its dequantized weight (`columns`:
    one whose every part is held in column blocks)."""
    if dtype == torch.bfloat16 and not cpu_has_bfloat16_arithmetic():
        return ALWAYS_KERNEL
    limits = _COLUMNS_DEQUANTIZE_MIN_ROWS if columns else _DEQUANTIZE_MIN_ROWS
    return limits.get(dtype, limits[torch.float32])


class GgufLinear(nn.Module):
    """y = x W^T + b, W = the segments' rows one after another: [(GGUF type name, raw rows uint8
    [rows, in_features / block weights * block bytes])]. Where the kernel multiplies column blocks fast
    (AVX-512), the types that have them are held that way (gguf_columns.py), the others as the file's rows."""

    def __init__(self, segments: list[tuple[str, torch.Tensor]], in_features: int, bias: torch.Tensor | None,
                 kernel: GgufLinearKernel) -> None:
        super().__init__()
        for qtype, rows in segments:
            _check_segment(qtype, rows, in_features)
        self.in_features, self.kernel, self.bias = in_features, kernel, bias
        self.qtypes = [qtype for qtype, _ in segments]
        self.segment_rows = [rows.shape[0] for _, rows in segments]
        self.out_features = sum(self.segment_rows)
        self.column_parts: list[tuple[str, ...]] = []  # per segment: its column-block buffers, or () for rows
        for index, (qtype, rows) in enumerate(segments):
            if kernel.columns_fast and gguf_columns.fits(qtype, in_features):
                packed = gguf_columns.pack(qtype, rows.numpy(), in_features)
                for part, buffer in packed.items():
                    self.register_buffer(f"columns_{index}_{part}", buffer)
                self.column_parts.append(tuple(packed))
            else:
                self.register_buffer(f"blocks_{index}", rows.contiguous())
                self.column_parts.append(())
        self._c_segments: tuple[tuple[int, ...], ctypes.Array] | None = None

    def dequantize_min_rows(self, dtype: torch.dtype) -> int:
        """The fewest rows of `dtype` this layer multiplies by its dequantized weight."""
        return dequantize_min_rows(dtype, columns=all(self.column_parts))

    def held(self, index: int) -> torch.Tensor | dict[str, torch.Tensor]:
        """Segment `index`'s buffers: the file's rows, or its column blocks by part name."""
        if not self.column_parts[index]:
            return getattr(self, f"blocks_{index}")
        return {part: getattr(self, f"columns_{index}_{part}") for part in self.column_parts[index]}

    def _buffers_held(self) -> list[torch.Tensor]:
        return [buffer for index in range(len(self.qtypes)) for buffer in _tensors(self.held(index))]

    def segments(self) -> ctypes.Array:
        """The C segment array, rebuilt when a buffer moved (after .to() or a load_state_dict)."""
        # Every registered buffer's address (the held ones and any other): read straight from the
        # module's buffer table, as this runs for each call of the layer (an LM head's every step).
        addresses = tuple(buffer.data_ptr() for buffer in self._buffers.values() if buffer is not None)
        if self._c_segments is None or self._c_segments[0] != addresses:
            held = [(_type_id(qtype), self.held(index), rows)
                    for index, (qtype, rows) in enumerate(zip(self.qtypes, self.segment_rows, strict=True))]
            self._c_segments = (addresses, segment_array(held))
        return self._c_segments[1]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if copy_takes(self, x.numel() // self.in_features, x.dtype):  # many rows: the bfloat16 copy (bf16_copies.py)
            return self.__dict__["bf16_copy"](x)
        rows = x.reshape(-1, self.in_features)
        if rows.shape[0] >= self.dequantize_min_rows(rows.dtype):
            out = self._dequantized_product(rows)
        else:
            out = self.kernel(rows, self.segments(), self.out_features, self.in_features, self.bias)
        return out.view(*x.shape[:-1], self.out_features)

    def forward_gated(self, gate_up: torch.Tensor) -> torch.Tensor | None:
        """self(silu(gate) * up) from a gated MLP's [gate | up] in one native call, else None."""
        if copy_takes(self, gate_up.numel() // (2 * self.in_features), gate_up.dtype):
            return self.__dict__["bf16_copy"].forward_gated(gate_up)
        rows = gate_up.reshape(-1, 2 * self.in_features)
        if rows.shape[0] >= self.dequantize_min_rows(rows.dtype):
            return None
        out = self.kernel(rows, self.segments(), self.out_features, self.in_features, self.bias, gated=True)
        return out.view(*gate_up.shape[:-1], self.out_features)

    def forward_float32(self, x: torch.Tensor) -> torch.Tensor | None:
        """self(x).float() in one native call (an LM head's logits), else None."""
        if copy_takes(self, x.numel() // self.in_features, x.dtype):
            return self.__dict__["bf16_copy"].forward_float32(x)
        rows = x.reshape(-1, self.in_features)
        if rows.shape[0] >= self.dequantize_min_rows(rows.dtype):
            return None
        out = self.kernel(rows, self.segments(), self.out_features, self.in_features, self.bias, float32_out=True)
        return out.view(*x.shape[:-1], self.out_features)

    def _dequantized_product(self, rows: torch.Tensor) -> torch.Tensor:
        """rows W^T + b with W dequantized (in rows' dtype when bfloat16, else float32) a chunk of output
        rows at a time; float32 inputs of other dtypes compute in float32."""
        dtype = torch.bfloat16 if rows.dtype == torch.bfloat16 else torch.float32
        x = rows.to(dtype)
        bias = None if self.bias is None else self.bias.to(dtype)
        parts = []
        for begin, end, segments in self._row_chunks():
            weight = self.kernel.dequantize(segments, self.kernel.scratch(end - begin, self.in_features, dtype))
            parts.append(F.linear(x, weight, None if bias is None else bias[begin:end]))
        out = parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)
        return out.to(rows.dtype)

    def _row_chunks(self) -> Iterator[tuple[int, int, ctypes.Array]]:
        """(begin, end, C segments) of output rows, at most _DEQUANTIZE_CHUNK weights each, whole
        16-column blocks of one segment (the whole layer at once when it fits)."""
        if self.out_features * self.in_features <= _DEQUANTIZE_CHUNK:
            yield 0, self.out_features, self.segments()
            return
        step = max(BLOCK_COLUMNS, _DEQUANTIZE_CHUNK // self.in_features // BLOCK_COLUMNS * BLOCK_COLUMNS)
        first = 0
        for index, (qtype, count) in enumerate(zip(self.qtypes, self.segment_rows, strict=True)):
            held = self.held(index)
            for low in range(0, count, step):
                high = min(low + step, count)
                if isinstance(held, dict):  # buffers are [blocks, ...]: a slice of blocks is a slice of rows
                    blocks = slice(low // BLOCK_COLUMNS, -(-high // BLOCK_COLUMNS))
                    part = {name: buffer[blocks] for name, buffer in held.items()}
                else:
                    part = held[low:high]
                yield first + low, first + high, segment_array([(_type_id(qtype), part, high - low)])
            first += count

    def dequantized(self) -> torch.Tensor:
        """The float32 weight this layer multiplies by (for tests and accuracy checks)."""
        return self.kernel.dequantize(self.segments(), torch.empty(self.out_features, self.in_features))

    def resident_bytes(self) -> int:
        return sum(buffer.numel() * buffer.element_size() for buffer in self._buffers_held())

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"qtypes={'+'.join(self.qtypes)}, bias={self.bias is not None}")


def _type_id(qtype: str) -> int:
    return int(GGMLQuantizationType[qtype])


def _tensors(held: torch.Tensor | dict[str, torch.Tensor]) -> list[torch.Tensor]:
    return list(held.values()) if isinstance(held, dict) else [held]


def _check_segment(qtype: str, rows: torch.Tensor, in_features: int) -> None:
    if qtype not in GGUF_KERNEL_TYPES:
        raise ValueError(f"GGUF type must be one of {', '.join(GGUF_KERNEL_TYPES)}, got {qtype!r}")
    weights, block_bytes = GGUF_KERNEL_TYPES[qtype]
    if in_features % weights:
        raise ValueError(f"{qtype} rows hold blocks of {weights} weights; in_features {in_features} is not a multiple")
    expected = in_features // weights * block_bytes
    if rows.dtype != torch.uint8 or rows.dim() != 2 or rows.shape[1] != expected:
        raise ValueError(f"{qtype} rows of {in_features} weights are uint8 [rows, {expected}], "
                         f"got {rows.dtype} {tuple(rows.shape)}")
