"""Weight-only quantized linear layers for the CPU: int8 per output channel, int4 in groups of 32.

Each runs either our native kernel (csrc/int8_linear.c, csrc/int4_linear.c: `cpu_linear="auto"`, the default) or
torch's CPU weight-packed kernels (otherwise, or without a C compiler); a layer holds only its
kernel's layout.

The native 4-bit kernel keeps GGUF's values (4 bits, float16 scale and offset per group of 32) in
blocks of 16 output columns, one column per vector lane (csrc/int4_linear.c; column_layout.py's pack_column_blocks
writes the layout), and both native kernels quantize each group of 32 input values to int16 (one
scale each), so a group's dot product is exact integer arithmetic (csrc/quantized_inputs.h has the
measurements: on SmolLM2 Q4_1, top-1 agreement with the float32 model of the same weights 98.8%,
mean KL 0.0019 nats). The int8 kernel keeps its values in blocks of 16 columns alike (csrc/int8_linear.c).
Either computes a row's result to the same bits whatever other rows share the call.

Many rows at once (a prefill, a large decode batch) are compute-bound in those kernels, where a
plain matrix product is faster: from `dequantize_min_rows` rows on, a layer writes its weight out
(bit for bit what `dequantized()` gives, rounded to bfloat16 for bfloat16 inputs) into a scratch
buffer, up to 2^24 weights at a time, and multiplies by it with torch. Measured with the column-block
kernels on a 2-core Xeon VM (AVX-512, 2 threads; kernel vs dequantize + product): 4-bit 3072 x 576,
bfloat16, 0.79 vs 3.43 ms at 32 rows, 2.20 vs 3.56 at 64, 3.66 vs 4.02 at 128, 5.67 vs 4.60 at 256;
int8 bfloat16, the 49152 x 576 head: 9.0 vs 60 ms at 32 rows, 33 vs 81 at 128, 64 vs 60 at 256.
(On a Zen 4 with the earlier per-column kernels, 2.5-3x slower per row, dequantizing won from 32
rows for 4-bit and 64 for int8; oneDNN's product there was faster than on this VM.) float32 4-bit
and int8 keep their earlier limits: float32 4-bit 1.62 vs 1.07 ms at 32 rows, 2.2 vs 2.1 at 64, 5.9
vs 8.6 at 256 on the Zen 4 with the earlier kernel; int8 float32 lost up
to 256 rows. CPUs without bfloat16 arithmetic (no AVX512-BF16 or AMX) multiply bfloat16 slowly, so
there bfloat16 keeps the kernels.

Torch's kernels dequantize inside the matmul:
- Int8Linear: `_weight_int8pack_mm(x, q [N, K] int8, scales [N])`, w = q * scale[n];
- Int4Linear: `_weight_int4pack_mm_for_cpu(x, packed, group, scales_and_zeros [K / group, N, 2])`,
  w = (q - 8) * scale + zero for q in 0..15, one (scale, zero) per row and group of 32 columns.
  GGUF's Q4_0 (w = d * (q - 8)) maps to scale d, zero 0; Q4_1 (w = d * q + m) to scale d, zero
  m + 8d. Worked example: d = 0.1, m = -0.8, q = 3 -> Q4_1 0.3 - 0.8 = -0.5; here (3 - 8) * 0.1 +
  (-0.8 + 0.8) = -0.5.
Torch's kernels are fast only for bfloat16 activations (measured on the default model's shapes, one
row: 3-15x slower with float32), so they compute in bfloat16 whatever the model's dtype, casting
the input and output when it differs; their scales and zeros are bfloat16 for the same reason.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import TypeVar

import torch
import torch.nn.functional as F
from torch import nn

from pipeline.model.cpu.kernels import QuantizedLinearKernel, load_quantized_linear_kernel
from pipeline.model.cpu.library import cpu_has_bfloat16_arithmetic
from pipeline.model.layers.bf16_copies import copy_takes
from pipeline.model.layers.column_layout import (
    BLOCK_COLUMNS,
    GROUP_SIZE,
    pack_block_scales,
    pack_column_blocks,
    pack_int8_blocks,
    unpack_block_scales,
    unpack_column_blocks,
    unpack_int8_blocks,
)

COMPUTE_DTYPE = torch.bfloat16
LayerT = TypeVar("LayerT", bound=nn.Module)


# (bits, dtype) -> rows, measured (module docstring); int8 in float32 was never faster dequantized.
_DEQUANTIZE_MIN_ROWS = {(4, torch.bfloat16): 128, (4, torch.float32): 128, (8, torch.bfloat16): 256}
ALWAYS_KERNEL = 1 << 30  # dequantize_min_rows where the kernel takes every row count
# 4-bit products of this many bfloat16 rows or more run on AMX tiles where the CPU has them (csrc/int4_amx.c)
AMX_MIN_ROWS = int(os.environ.get("AQUEDUCT_AMX_MIN_ROWS", "16"))
_DEQUANTIZE_CHUNK = 1 << 24  # weights dequantized at a time: the scratch buffer stays within 64 MiB


def _bfloat16_arithmetic() -> bool:
    """Whether the CPU multiplies bfloat16 natively, so torch's bfloat16 product is fast."""
    return cpu_has_bfloat16_arithmetic()


def dequantize_min_rows(dtype: torch.dtype, bits: int = 4) -> int:
    """The fewest rows of `dtype` for which a native `bits`-bit layer multiplies by its dequantized weight."""
    if dtype == torch.bfloat16 and not _bfloat16_arithmetic():
        return ALWAYS_KERNEL
    return _DEQUANTIZE_MIN_ROWS.get((bits, dtype), ALWAYS_KERNEL)


@contextlib.contextmanager
def per_group_kernel_only(active: bool = True) -> Iterator[None]:
    """Within (when `active`): native 4- and 8-bit layers take their kernel for every row count. For
    measurements that compare the two paths in one process (benchmarks/quant_accuracy.py, cpu_speed.py)."""
    global dequantize_min_rows
    original = dequantize_min_rows
    if active:
        dequantize_min_rows = lambda _dtype, bits=4: ALWAYS_KERNEL  # noqa: E731
    try:
        yield
    finally:
        dequantize_min_rows = original


def _dequantized_product(rows: torch.Tensor, bias: torch.Tensor | None, out_features: int,
                         dequantize: Callable[[int, int], torch.Tensor], multiple: int = 1) -> torch.Tensor:
    """rows W^T + b, W's output rows [begin, end) dequantized by dequantize(begin, end) a chunk at a time
    (a 128k-token int8 LM head would take 1 GiB at once in bfloat16); chunks start at multiples of `multiple`."""
    step = max(multiple, _DEQUANTIZE_CHUNK // rows.shape[1] // multiple * multiple)
    bias = None if bias is None else bias.to(rows.dtype)
    parts = [F.linear(rows, dequantize(begin, min(begin + step, out_features)),
                      None if bias is None else bias[begin:begin + step])
             for begin in range(0, out_features, step)]
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)


def _rows_of(x: torch.Tensor, in_features: int) -> torch.Tensor:
    return x.reshape(-1, in_features).to(COMPUTE_DTYPE).contiguous()


class Int8Linear(nn.Module):
    """y = x (q * scale)^T + b, q int8 [N, K], one scale per output row."""

    def __init__(self, weight_int8: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None,
                 native: QuantizedLinearKernel | None = None) -> None:
        super().__init__()
        self.out_features, self.in_features = weight_int8.shape
        self.native = native
        self.bias = bias
        if native is not None:  # csrc/int8_linear.c's layout; float32 scales holding the bfloat16 values
            self.register_buffer("column_blocks", pack_int8_blocks(weight_int8))
            padded = torch.zeros(self.column_blocks.shape[0] * BLOCK_COLUMNS)
            padded[:self.out_features] = scales.to(COMPUTE_DTYPE).float()
            self.register_buffer("scales", padded)
            return
        self.register_buffer("weight_int8", weight_int8.contiguous())
        self.register_buffer("scales", scales.to(COMPUTE_DTYPE).contiguous())

    @classmethod
    def from_float(cls, weight: torch.Tensor, bias: torch.Tensor | None = None,
                   native: QuantizedLinearKernel | None = None) -> Int8Linear:
        """Symmetric per-channel quantization: scale = max |w| of the row / 127."""
        return cls(*quantize_per_channel(weight), bias, native)

    @classmethod
    def from_packed(cls, buffers: dict[str, torch.Tensor], bias: torch.Tensor | None,
                    native: QuantizedLinearKernel) -> Int8Linear:
        """A native layer from the buffers of one packed before (`packed_buffers()`, layers/packed_cache.py)."""
        return _from_packed(cls, buffers, bias, native, ("column_blocks", "scales"))

    def packed_buffers(self) -> dict[str, torch.Tensor]:
        return _packed(self, ("column_blocks", "scales"))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if copy_takes(self, x.numel() // self.in_features, x.dtype):  # many rows: the bfloat16 copy (bf16_copies.py)
            return self.__dict__["bf16_copy"](x)
        if self.native is not None:
            rows = x.reshape(-1, self.in_features)
            if rows.shape[0] >= dequantize_min_rows(rows.dtype, bits=8):
                out = _dequantized_product(rows, self.bias, self.out_features,
                                           lambda begin, end: self._dequantize(begin, end, rows.dtype),
                                           multiple=BLOCK_COLUMNS)
                return out.view(*x.shape[:-1], self.out_features)
            out = self.native.int8(rows, self.column_blocks, self.scales, self.out_features, self.in_features,
                                   self.bias)
            return out.view(*x.shape[:-1], self.out_features)
        out = torch.ops.aten._weight_int8pack_mm(_rows_of(x, self.in_features), self.weight_int8, self.scales)
        if self.bias is not None:
            out = out + self.bias.to(out.dtype)
        return out.to(x.dtype).view(*x.shape[:-1], self.out_features)

    def _dequantize(self, begin: int, end: int, dtype: torch.dtype) -> torch.Tensor:
        """Output rows [begin, end) as a plain weight of `dtype`; begin a multiple of 16."""
        blocks = slice(begin // BLOCK_COLUMNS, -(-end // BLOCK_COLUMNS))
        scales = self.scales[blocks.start * BLOCK_COLUMNS:blocks.stop * BLOCK_COLUMNS]
        return self.native.dequantize_int8(self.column_blocks[blocks], scales, end - begin, self.in_features, dtype)

    def forward_gated(self, gate_up: torch.Tensor) -> torch.Tensor | None:
        """self(silu(gate) * up) from a gated MLP's [gate | up] in one native call, else None."""
        if copy_takes(self, gate_up.numel() // (2 * self.in_features), gate_up.dtype):
            return self.__dict__["bf16_copy"].forward_gated(gate_up)
        if self.native is None or gate_up.reshape(-1, 2 * self.in_features).shape[0] >= dequantize_min_rows(
                gate_up.dtype, bits=8):
            return None
        out = self.native.int8(gate_up.reshape(-1, 2 * self.in_features), self.column_blocks, self.scales,
                               self.out_features, self.in_features, self.bias, gated=True)
        return out.view(*gate_up.shape[:-1], self.out_features)

    def forward_float32(self, x: torch.Tensor) -> torch.Tensor | None:
        """self(x).float() in one native call (an LM head's logits), else None."""
        if copy_takes(self, x.numel() // self.in_features, x.dtype):
            return self.__dict__["bf16_copy"].forward_float32(x)
        if self.native is None or x.reshape(-1, self.in_features).shape[0] >= dequantize_min_rows(x.dtype, bits=8):
            return None
        out = self.native.int8(x.reshape(-1, self.in_features), self.column_blocks, self.scales, self.out_features,
                               self.in_features, self.bias, float32_out=True)
        return out.view(*x.shape[:-1], self.out_features)

    def dequantized(self) -> torch.Tensor:
        """The float32 weight this layer multiplies by (for tests and accuracy checks)."""
        if self.native is not None:
            values = unpack_int8_blocks(self.column_blocks, self.out_features, self.in_features)
            return values.float() * self.scales[:self.out_features, None]
        return self.weight_int8.float() * self.scales.float()[:, None]

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"native={self.native is not None}")


def quantize_per_channel(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float [N, K] -> (int8 [N, K], scales [N]); an all-zero row gets scale 1 (q = 0)."""
    weight = weight.detach().float()
    # Rounded to bfloat16 first, so q is computed against the scale the kernel will use.
    scales = (weight.abs().amax(dim=1) / 127.0).to(COMPUTE_DTYPE).float()
    scales = torch.where(scales > 0, scales, torch.ones_like(scales))
    weight_int8 = torch.round(weight / scales[:, None]).clamp(-127, 127).to(torch.int8)
    return weight_int8, scales


class Int4Linear(nn.Module):
    """y = x W^T + b with W = (q - 8) * scale + zero per group of 32 columns, q in 0..15."""

    many_rows_on_amx = True  # AMX_MIN_ROWS rows or more on AMX tiles where available (amx_takes)

    def __init__(self, values: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
                 bias: torch.Tensor | None, native: QuantizedLinearKernel | None = None) -> None:
        """values [N, K] integers 0..15; scales, zeros [N, K / 32] (float)."""
        super().__init__()
        self.out_features, self.in_features = values.shape
        if self.in_features % GROUP_SIZE:
            raise ValueError(f"int4 weights need in_features divisible by {GROUP_SIZE}, got {self.in_features}")
        self.native = native
        self.bias = bias
        if native is not None:
            # w = q * d + m with m = zero - 8 d: GGUF's own (d, m) for Q4_1, (d, -8 d) for Q4_0.
            offsets = zeros.double() - 8.0 * scales.double()
            self.register_buffer("column_blocks", pack_column_blocks(values))
            self.register_buffer("block_scales", pack_block_scales(scales.double().half(), offsets.half()))
            return
        self.register_buffer("packed", torch.ops.aten._convert_weight_to_int4pack_for_cpu(
            values.to(torch.int32).contiguous(), 1))
        # [N, G] scales and zeros -> [G, N, 2], the kernel's layout.
        pairs = torch.stack([scales.float().t(), zeros.float().t()], dim=-1)
        self.register_buffer("scales_and_zeros", pairs.to(COMPUTE_DTYPE).contiguous())

    @classmethod
    def from_packed(cls, buffers: dict[str, torch.Tensor], bias: torch.Tensor | None,
                    native: QuantizedLinearKernel) -> Int4Linear:
        """A native layer from the buffers of one packed before (`packed_buffers()`, layers/packed_cache.py)."""
        return _from_packed(cls, buffers, bias, native, ("column_blocks", "block_scales"))

    def packed_buffers(self) -> dict[str, torch.Tensor]:
        return _packed(self, ("column_blocks", "block_scales"))

    def amx_takes(self, rows: int, dtype: torch.dtype) -> bool:
        """Whether `rows` rows of `dtype` multiply on AMX tiles (csrc/int4_amx.c): bfloat16, AMX_MIN_ROWS
        rows or more, on a CPU and process that have AMX."""
        return (self.many_rows_on_amx and rows >= AMX_MIN_ROWS and dtype == torch.bfloat16
                and self.native is not None and self.native.int4_amx_available)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.amx_takes(x.numel() // self.in_features, x.dtype):
            out = self.native.int4_amx(x.reshape(-1, self.in_features), self.column_blocks, self.block_scales,
                                       self.out_features, self.bias)
            return out.view(*x.shape[:-1], self.out_features)
        if copy_takes(self, x.numel() // self.in_features, x.dtype):  # many rows: the bfloat16 copy (bf16_copies.py)
            return self.__dict__["bf16_copy"](x)
        if self.native is not None:
            rows = x.reshape(-1, self.in_features)
            if rows.shape[0] >= dequantize_min_rows(rows.dtype):
                out = _dequantized_product(rows, self.bias, self.out_features,
                                           lambda begin, end: self._dequantize(begin, end, rows.dtype),
                                           multiple=BLOCK_COLUMNS)
                return out.view(*x.shape[:-1], self.out_features)
            out = self.native.int4(rows, self.column_blocks, self.block_scales, self.out_features, self.bias)
            return out.view(*x.shape[:-1], self.out_features)
        out = torch.ops.aten._weight_int4pack_mm_for_cpu(_rows_of(x, self.in_features), self.packed, GROUP_SIZE,
                                                         self.scales_and_zeros)
        if self.bias is not None:
            out = out + self.bias.to(out.dtype)
        return out.to(x.dtype).view(*x.shape[:-1], self.out_features)

    def _dequantize(self, begin: int, end: int, dtype: torch.dtype) -> torch.Tensor:
        """Output rows [begin, end) as a plain weight of `dtype`; begin a multiple of 16."""
        blocks = slice(begin // BLOCK_COLUMNS, -(-end // BLOCK_COLUMNS))
        return self.native.dequantize_int4(self.column_blocks[blocks], self.block_scales[blocks], end - begin, dtype)

    def forward_gated(self, gate_up: torch.Tensor) -> torch.Tensor | None:
        """self(silu(gate) * up) from a gated MLP's [gate | up] in one native call, else None."""
        rows = gate_up.numel() // (2 * self.in_features)
        if copy_takes(self, rows, gate_up.dtype):
            return self.__dict__["bf16_copy"].forward_gated(gate_up)
        if self.amx_takes(rows, gate_up.dtype):  # gated as the native kernels gate (the C decoder's too)
            out = self.native.int4_amx(gate_up.reshape(-1, 2 * self.in_features), self.column_blocks,
                                       self.block_scales, self.out_features, self.bias, gated=True)
            return out.view(*gate_up.shape[:-1], self.out_features)
        if self.native is None or gate_up.reshape(-1, 2 * self.in_features).shape[0] >= dequantize_min_rows(
                gate_up.dtype):
            return None
        out = self.native.int4(gate_up.reshape(-1, 2 * self.in_features), self.column_blocks, self.block_scales,
                               self.out_features, self.bias, gated=True)
        return out.view(*gate_up.shape[:-1], self.out_features)

    def forward_float32(self, x: torch.Tensor) -> torch.Tensor | None:
        """self(x).float() in one native call (an LM head's logits), else None."""
        rows = x.numel() // self.in_features
        if copy_takes(self, rows, x.dtype):
            return self.__dict__["bf16_copy"].forward_float32(x)
        if self.amx_takes(rows, x.dtype):
            return None
        if self.native is None or x.reshape(-1, self.in_features).shape[0] >= dequantize_min_rows(x.dtype):
            return None
        out = self.native.int4(x.reshape(-1, self.in_features), self.column_blocks, self.block_scales,
                               self.out_features, self.bias, float32_out=True)
        return out.view(*x.shape[:-1], self.out_features)

    def dequantized(self) -> torch.Tensor:
        """The float32 weight this layer multiplies by."""
        if self.native is not None:
            values = unpack_column_blocks(self.column_blocks, self.out_features).float()
            scales, offsets = (unpack_block_scales(self.block_scales, self.out_features)[i].float()
                               .repeat_interleave(GROUP_SIZE, dim=1) for i in (0, 1))
            return values * scales + offsets
        eye = torch.eye(self.in_features, dtype=COMPUTE_DTYPE)  # torch's kernel applied to the identity
        return torch.ops.aten._weight_int4pack_mm_for_cpu(eye, self.packed, GROUP_SIZE,
                                                          self.scales_and_zeros).float().t()

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, group_size={GROUP_SIZE}, "
                f"bias={self.bias is not None}, native={self.native is not None}")


def native_kernel_for(cpu_linear: str) -> QuantizedLinearKernel | None:
    """The native quantized kernel when `cpu_linear` uses it (auto), and a C compiler built it.

    SmolLM2 Q4_1, 2 threads, on a Zen 4 with AVX-512: 145-159 tokens/s against 54-55 with torch's int4
    kernel (benchmarks/cpu_speed.py, gguf-q4 vs gguf-q4 onednn); on a Xeon with AMX torch's kernel gave
    52 tokens/s, ours was not run there."""
    if cpu_linear != "auto":
        return None
    return load_quantized_linear_kernel()


def quantized_kernels_work() -> bool:
    """Whether this torch build has the CPU int8/int4 weight-packed kernels (torch >= 2.5)."""
    aten = torch.ops.aten
    return all(hasattr(aten, name) for name in ("_weight_int8pack_mm", "_weight_int4pack_mm_for_cpu",
                                                 "_convert_weight_to_int4pack_for_cpu"))


def _packed(layer: nn.Module, names: tuple[str, ...]) -> dict[str, torch.Tensor]:
    """A native layer's buffers and its [out_features, in_features]."""
    return {**{name: getattr(layer, name) for name in names},
            "shape": torch.tensor([layer.out_features, layer.in_features])}


def _from_packed(cls: type[LayerT], buffers: dict[str, torch.Tensor], bias: torch.Tensor | None,
                 native: QuantizedLinearKernel, names: tuple[str, ...]) -> LayerT:
    """`cls` with these buffers, as its constructor would have made it for the native kernel."""
    layer = cls.__new__(cls)
    nn.Module.__init__(layer)
    layer.out_features, layer.in_features = (int(size) for size in buffers["shape"])
    layer.native, layer.bias = native, bias
    for name in names:
        layer.register_buffer(name, buffers[name])
    return layer
