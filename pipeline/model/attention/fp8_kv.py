"""fp8 KV cache: storage formats, per-layer scales, quantize on write and dequantize on read.

With `kv_cache_dtype` fp8_e4m3 or fp8_e5m2, each layer's cache holds K and V as one byte per
element: stored = saturate(x / scale) in the format, read back as stored * scale. A layer has one
scale for K and one for V (per tensor, as vLLM's fp8 checkpoints): from the checkpoint's
`k_scale`/`v_scale` (or one `kv_scale` for both) when present, else 1.0, or, with
`calculate_kv_scales`, from the absolute maximum of the first prefill's K/V.

Floating-point formats keep their relative precision over their whole normal range, so the scale
only moves that range (e4m3: 2^-6 .. 448, 3 mantissa bits; e5m2: 2^-14 .. 57344, 2 bits): a
value x in range comes back within 2^-4 |x| (e4m3) or 2^-3 |x| (e5m2). Beyond the range the
write saturates to the largest finite value (a plain cast would give NaN or inf).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch

# --kv-cache-dtype value -> torch storage dtype ("auto" = the model's dtype, no quantization).
FP8_DTYPES: dict[str, torch.dtype] = {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}
# The C kernel's format codes (csrc/paged_decode_attention.c): 0 = float32.
KERNEL_FORMATS: dict[torch.dtype, int] = {torch.float8_e4m3fn: 1, torch.float8_e5m2: 2}
# calculate_kv_scales leaves this factor of headroom above the first prefill's maximum, so later
# tokens a little larger than any seen so far are not clipped (it costs no relative precision).
_CALCULATED_HEADROOM = 2.0
# Checkpoint names of the scales: "model.layers.3.self_attn.k_scale", "...self_attn.kv_scale",
# and the "...self_attn.k_proj.k_scale" form some quantizers write.
_SCALE_NAME = re.compile(r"(?:^|\.)layers\.(\d+)\..*\b(k_scale|v_scale|kv_scale)$")


@dataclass(slots=True)
class Fp8KVCache:
    """One layer's fp8 cache: data [2, blocks, block_size, kv_heads, head_dim] (0 = K, 1 = V) and
    its scales, 0-dim float32 tensors on the cache's device (updated in place, so a captured CUDA
    graph sees calculated scales)."""

    data: torch.Tensor
    k_scale: torch.Tensor
    v_scale: torch.Tensor
    pending_scales: bool = False  # calculate the scales from the next write

    @property
    def shape(self) -> torch.Size:
        return self.data.shape

    @property
    def dtype(self) -> torch.dtype:
        return self.data.dtype

    def scale(self, half: int) -> torch.Tensor:
        return self.k_scale if half == 0 else self.v_scale


def fp8_max(dtype: torch.dtype) -> float:
    return float(torch.finfo(dtype).max)


def quantize(x: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x / scale saturated to the format's finite range, as `dtype` (computed in float32)."""
    limit = fp8_max(dtype)
    return (x.float() / scale).clamp_(-limit, limit).to(dtype)


def dequantize_into(out: torch.Tensor, stored: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """out = stored * scale, in out's dtype (stored: fp8 values)."""
    out.copy_(stored)
    return out.mul_(scale.to(out.dtype))


def calculated_scale(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A scale that maps |x|'s maximum to 1 / _CALCULATED_HEADROOM of the format's maximum
    (never 0: an all-zero tensor gets 1.0)."""
    absmax = x.detach().abs().max().float()
    scale = absmax * _CALCULATED_HEADROOM / fp8_max(dtype)
    return torch.where(scale > 0, scale, torch.ones_like(scale))


def kv_scale_of(name: str) -> tuple[int, str] | None:
    """(layer index, which) for a checkpoint KV-scale tensor name, else None.

    "model.layers.3.self_attn.k_scale" -> (3, "k_scale"); "model.layers.0.mlp.up_proj.weight" -> None
    """
    match = _SCALE_NAME.search(name)
    return (int(match.group(1)), match.group(2)) if match else None


def split_kv_scales(weights: Iterable[tuple[str, torch.Tensor]],
                    found: dict[int, dict[str, float]]) -> Iterator[tuple[str, torch.Tensor]]:
    """Pass every weight through except KV scales, which go into found[layer][which]."""
    for name, tensor in weights:
        located = kv_scale_of(name)
        if located is None:
            yield name, tensor
            continue
        if tensor.numel() != 1:
            raise ValueError(f"KV scale {name} must hold one value (per-tensor scale), has shape {tuple(tensor.shape)}")
        layer, which = located
        found.setdefault(layer, {})[which] = float(tensor.float().item())


def layer_scales(found: dict[int, dict[str, float]], layer: int) -> tuple[float, float]:
    """(k_scale, v_scale) of a layer: its own, else the shared kv_scale, else 1.0."""
    scales = found.get(layer, {})
    shared = scales.get("kv_scale", 1.0)
    k_scale, v_scale = scales.get("k_scale", shared), scales.get("v_scale", shared)
    for which, value in (("k_scale", k_scale), ("v_scale", v_scale)):
        if not value > 0 or value == float("inf"):
            raise ValueError(f"checkpoint {which} of layer {layer} must be a positive finite number, got {value}")
    return k_scale, v_scale


def allocate_fp8_caches(zeros: Iterable[torch.Tensor], found: dict[int, dict[str, float]],
                        calculate: bool) -> list[Fp8KVCache]:
    """Wrap each layer's zeroed fp8 tensor with its scales."""
    caches = []
    for layer, data in enumerate(zeros):
        k_scale, v_scale = layer_scales(found, layer)
        caches.append(Fp8KVCache(data, torch.tensor(k_scale, device=data.device),
                                 torch.tensor(v_scale, device=data.device), pending_scales=calculate))
    return caches
