"""Which attention backend a runner uses (ModelConfig.attention_backend).

auto: FlexAttention on CUDA (paged: each query reads only its own blocks, and CUDA graphs replay
it with static block-mask buffers); on CPU the portable torch backend with the native decode
kernel, measured faster there than FlexAttention compiled for CPU (README, "GPU").
"""

from __future__ import annotations

import torch

from pipeline.model.attention import TorchPagedAttention
from pipeline.model.attention_shape import AttentionShape
from pipeline.model.cpu_kernel import load_decode_kernel
from pipeline.model.flex_attention import FlexPagedAttention

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
    if device.type == "cpu" and dtype == torch.float32:
        backend.decode_kernel = load_decode_kernel()
    return backend
