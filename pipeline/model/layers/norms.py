"""RMSNorm in its three forms, as HF transformers computes them: Llama's (normalise in float32, round,
then scale), OLMo 2's (scale in float32, round last) and Gemma's (scale by 1 + weight in float32, round
last); Llama's runs through the native CPU kernel where one is built.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from pipeline.model.cpu.kernels import RMSNormKernel, load_rms_norm_kernel


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps
        self.kernel: RMSNormKernel | None = None  # set by use_native_norms (CPU)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kernel is not None and self.kernel.applies(x, self.weight):
            return self.kernel(x, self.weight, self.eps)  # the kernel reads data_ptr: no detach per call
        if x.dtype == torch.float32 and self.weight.dtype == torch.float32:
            # torch's fused kernel: one op instead of six (61 norms per step of a 30-layer model),
            # the same arithmetic as below in float32.
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        # HF's op order in narrower dtypes: normalise in float32, round, then scale.
        x_f32 = x.float()
        variance = x_f32.pow(2).mean(-1, keepdim=True)
        return self.weight * (x_f32 * torch.rsqrt(variance + self.eps)).to(x.dtype)


def use_native_norms(model: nn.Module) -> int:
    """Run `model`'s (Llama-form) RMSNorms through the native kernel (csrc/rms_norm.c); returns how
    many, 0 when it cannot be built. One call instead of several torch ops each (one 576-wide row on
    a 2-core Zen 3 box: float32 34 -> 24 us, bfloat16 67 -> 23 us; 61 norms per SmolLM2 step)."""
    kernel = load_rms_norm_kernel()
    norms = [module for module in model.modules() if type(module) is RMSNorm] if kernel is not None else []
    for norm in norms:
        norm.kernel = kernel
    return len(norms)


class Float32RMSNorm(nn.Module):
    """RMSNorm that scales by its weight in float32 and rounds last (HF's OLMo 2 order).

    The same arithmetic as RMSNorm in float32; in bfloat16 it rounds once, where RMSNorm rounds the
    normalised x and then the product.
    """

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32 and self.weight.dtype == torch.float32:
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)  # one op, see RMSNorm
        x_f32 = x.float()
        normed = x_f32 * torch.rsqrt(x_f32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight * normed).to(x.dtype)


class GemmaRMSNorm(nn.Module):
    """RMSNorm that scales by (1 + weight), all in float32, cast back last (HF's Gemma order).

    A checkpoint's weight 0 is the identity scale. In bfloat16 the two norms round differently:
    Llama's rounds the normalised x before the multiply, this one only the product.
    """

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x_f32 = x.float()
        normed = x_f32 * torch.rsqrt(x_f32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (normed * (1.0 + self.weight.float())).to(x.dtype)
