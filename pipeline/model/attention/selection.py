"""Which attention backend a runner uses (ModelConfig.attention_backend).

auto: FlexAttention on CUDA (paged: each query reads only its own blocks, and CUDA graphs replay
it with static block-mask buffers); on CPU the portable torch backend with the native decode
kernel, measured faster there than FlexAttention compiled for CPU (README, "GPU").
"""

from __future__ import annotations

import torch

from pipeline.model.attention.flex import FlexPagedAttention
from pipeline.model.attention.paged import TorchPagedAttention
from pipeline.model.attention.shape import AttentionShape
from pipeline.model.cpu.kernels import load_decode_kernel, load_rope_kv_kernel

AttentionImpl = TorchPagedAttention | FlexPagedAttention


def resolve_backend_name(name: str, device: torch.device) -> str:
    if name == "auto":
        return "flex" if device.type == "cuda" else "torch"
    return name


def make_backend(name: str, shape: AttentionShape, block_size: int, device: torch.device,
                 dtype: torch.dtype) -> AttentionImpl:
    args = (shape.num_heads, shape.num_kv_heads, shape.head_dim, block_size)
    if resolve_backend_name(name, device) == "flex":
        return FlexPagedAttention(*args, scale=shape.scale, windows=shape.windows, logit_softcap=shape.logit_softcap)
    backend = TorchPagedAttention(*args, scale=shape.scale, windows=shape.windows, logit_softcap=shape.logit_softcap)
    if device.type == "cpu" and dtype in (torch.float32, torch.bfloat16):
        # The decode kernel reads float32, bfloat16 and fp8 caches; the fused rope + KV write is
        # used only for float32/bfloat16 caches (attention.py keeps the quantizing write for fp8).
        backend.decode_kernel = load_decode_kernel()
        backend.rope_kv_kernel = load_rope_kv_kernel()
    return backend
