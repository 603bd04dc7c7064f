"""Which attention backend a runner uses (ModelConfig.attention_backend).

auto: FlexAttention on CUDA (paged: each query reads only its own blocks, and CUDA graphs replay
it with static block-mask buffers); on CPU the portable torch backend with the native decode
kernel, measured faster there than FlexAttention compiled for CPU (README, "GPU"). Multi-head latent
attention (DeepSeek's latent cache) has its own torch backend (latent.py), CPU only so far.
"""

from __future__ import annotations

import torch

from pipeline.model.attention.flex import FlexPagedAttention
from pipeline.model.attention.latent import LatentPagedAttention
from pipeline.model.attention.paged import PREFILL_ROWS_MAX_LEN, TorchPagedAttention
from pipeline.model.attention.shape import AttentionShape
from pipeline.model.cpu.kernels import load_decode_kernel, load_rope_kv_kernel

AttentionImpl = TorchPagedAttention | FlexPagedAttention | LatentPagedAttention


def resolve_backend_name(name: str, device: torch.device) -> str:
    if name == "auto":
        return "flex" if device.type == "cuda" else "torch"
    return name


def make_backend(name: str, shape: AttentionShape, block_size: int, device: torch.device,
                 dtype: torch.dtype) -> AttentionImpl:
    if shape.latent_dim is not None:
        return _latent_backend(name, shape, block_size, device)
    args = (shape.num_heads, shape.num_kv_heads, shape.head_dim, block_size)
    if resolve_backend_name(name, device) == "flex":
        if shape.attention_sinks and device.type != "cuda":
            # Sinks rescale by the kernel's log-sum-exp, which torch.compile's CPU flex kernel does not return.
            raise ValueError("attention sinks (gpt-oss) are not supported by FlexAttention on the CPU: "
                             "use attention_backend 'torch' or 'auto'")
        return FlexPagedAttention(*args, scale=shape.scale, windows=shape.windows, logit_softcap=shape.logit_softcap)
    backend = TorchPagedAttention(*args, scale=shape.scale, windows=shape.windows, logit_softcap=shape.logit_softcap)
    if device.type == "cpu" and dtype in (torch.float32, torch.bfloat16):
        # The decode kernel reads float32, bfloat16 and fp8 caches; the fused rope + KV write is
        # used only for float32/bfloat16 caches (attention.py keeps the quantizing write for fp8).
        backend.decode_kernel = load_decode_kernel()
        backend.rope_kv_kernel = load_rope_kv_kernel()
        plain = not shape.attention_sinks and shape.logit_softcap is None and shape.windows == frozenset({None})
        if dtype == torch.float32 and plain:
            backend.prefill_rows_max_len = PREFILL_ROWS_MAX_LEN  # paged.py: float32 short prefills by rows
    return backend


def _latent_backend(name: str, shape: AttentionShape, block_size: int, device: torch.device) -> LatentPagedAttention:
    """Multi-head latent attention (DeepSeek-V2/V3): the torch latent backend, on the CPU only for now."""
    if device.type != "cpu":
        raise ValueError("multi-head latent attention (DeepSeek-V2/V3) runs on the CPU only for now: FlexAttention "
                         f"and the CUDA graphs have no latent-cache path yet (device is {device})")
    if name not in ("auto", "torch"):
        raise ValueError(f"multi-head latent attention (DeepSeek-V2/V3) needs attention_backend 'auto' or 'torch', "
                         f"got {name!r}")
    assert shape.latent_dim is not None
    return LatentPagedAttention(shape.num_heads, shape.head_dim, shape.latent_dim, block_size, shape.scale,
                                windows=shape.windows)
