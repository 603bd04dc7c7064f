"""gpt-oss (GptOssForCausalLM): the Llama decoder with attention sinks and a clamped-SwiGLU mixture of experts.

What differs from Llama, each as HF transformers computes it:
- attention has biases on q, k, v and o (attention_bias, default true), and a learned sink logit per
  query head (`self_attn.sinks`) that joins every softmax denominator (attention/sinks.py): the torch
  path and the native CPU decode kernel add it to the softmax, FlexAttention rescales its output by it
  (on CUDA; refused on the CPU, whose compiled kernel returns no log-sum-exp);
- layers alternate sliding and full attention (`layer_types`; without it even-indexed layers slide);
- rope is YaRN by default (layers/yarn.py): interpolated frequencies, cos and sin scaled by the
  attention factor;
- every MLP is a mixture of experts (layers/clamped_moe.py): a biased router, softmax over the top-k
  logits, experts with biases and a SwiGLU clamped at `swiglu_limit` with `swiglu_alpha`;
- RMSNorm scales in float32 and rounds last (OLMo 2's order, layers/norms.Float32RMSNorm).

Checkpoints: q/k/v fuse as for Llama; the experts load in HF's layout (`mlp.experts.gate_up_proj`
[E, H, 2I] interleaved, `..._bias`, `down_proj` [E, I, H], `..._bias`) from an unquantized checkpoint
(what `save_pretrained` writes), or from MXFP4 `*_blocks`/`*_scales` pairs (the released checkpoints,
quantization_config quant_method "mxfp4"), dequantized at load into the model dtype (layers/mxfp4.py);
other quantization methods are refused. LoRA and tensor parallelism refuse mixture-of-experts models
(pipeline/model/lora.py, parallel/sharding.py); the native whole-layer decoder (native_decode.py) serves
only plain Llama models, so decode runs per op, its attention in the native decode kernel.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, fields, replace
from typing import Any

import torch
from torch import nn

from pipeline.model.attention.paged import AttentionBackend
from pipeline.model.attention.shape import AttentionShape
from pipeline.model.layers.clamped_moe import BiasedTopKMoE
from pipeline.model.layers.mxfp4 import dequantize_mxfp4
from pipeline.model.layers.norms import Float32RMSNorm
from pipeline.model.models import llama
from pipeline.model.models.llama import Attention, DecoderConfig, DecoderModel, LlamaForCausalLM

# GptOssConfig's defaults for keys a config.json may leave out.
_DEFAULTS: dict[str, Any] = {"head_dim": 64, "sliding_window": 128, "attention_bias": True, "rms_norm_eps": 1e-5,
                             "swiglu_alpha": 1.702, "swiglu_limit": 7.0, "tie_word_embeddings": False}
_DEFAULT_ROPE: dict[str, Any] = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                 "truncate": False, "original_max_position_embeddings": 4096, "rope_theta": 150000.0}


@dataclass(frozen=True, slots=True)
class GptOssConfig(DecoderConfig):
    swiglu_alpha: float = 1.702
    swiglu_limit: float = 7.0


def with_gpt_oss_defaults(config: dict[str, Any]) -> dict[str, Any]:
    """config.json with GptOssConfig's defaults filled in (layer_types, rope and the keys above)."""
    config = {**_DEFAULTS, **config}
    if not config.get("layer_types"):
        config["layer_types"] = ["sliding_attention" if index % 2 == 0 else "full_attention"
                                 for index in range(config["num_hidden_layers"])]
    if not (config.get("rope_parameters") or config.get("rope_scaling")):
        config["rope_parameters"] = {**_DEFAULT_ROPE, "rope_theta": config.get("rope_theta", 150000.0)}
    return config


def gpt_oss_config(config: dict[str, Any], max_positions: int) -> GptOssConfig:
    """GptOssConfig from an HF config.json dict; ValueError for quantizations other than MXFP4."""
    config = with_gpt_oss_defaults(config)
    method = (config.get("quantization_config") or {}).get("quant_method", "mxfp4")
    if method != "mxfp4":
        raise ValueError(f"gpt-oss quantization_config quant_method must be 'mxfp4' (dequantized at load) "
                         f"or absent, got {method!r}")
    base = replace(llama.decoder_config(config, max_positions), mlp_bias=False,
                   num_experts=int(config.get("num_local_experts", config.get("num_experts", 128))),
                   num_experts_per_tok=int(config.get("num_experts_per_tok", 4)))
    shared = {field.name: getattr(base, field.name) for field in fields(base)}
    return GptOssConfig(**shared, swiglu_alpha=float(config["swiglu_alpha"]),
                        swiglu_limit=float(config["swiglu_limit"]))


def attention_shape(config: dict[str, Any]) -> AttentionShape:
    gpt_oss = gpt_oss_config(config, max_positions=1)
    return AttentionShape(num_layers=gpt_oss.num_layers, num_heads=gpt_oss.num_heads,
                          num_kv_heads=gpt_oss.num_kv_heads, head_dim=gpt_oss.head_dim,
                          scale=gpt_oss.head_dim**-0.5, layer_windows=gpt_oss.layer_windows, attention_sinks=True)


def build_model(config: dict[str, Any], backend: AttentionBackend, max_positions: int) -> GptOssForCausalLM:
    return GptOssForCausalLM(gpt_oss_config(config, max_positions), backend)


class SinkAttention(Attention):
    """Llama's attention (with gpt-oss's q/k/v/o biases) plus a sink logit per query head."""

    def __init__(self, config: DecoderConfig, backend: AttentionBackend, window: int | None = None) -> None:
        super().__init__(config, backend, window)
        self.sinks = nn.Parameter(torch.empty(config.num_heads))

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor, metadata: object,
               **options: Any) -> torch.Tensor:
        return super().attend(q, k, v, kv_cache, metadata, sinks=self.sinks, **options)


class GptOssDecoderLayer(nn.Module):
    def __init__(self, config: GptOssConfig, backend: AttentionBackend, window: int | None) -> None:
        super().__init__()
        size, eps = config.hidden_size, config.rms_norm_eps
        self.input_layernorm = Float32RMSNorm(size, eps)
        self.self_attn = SinkAttention(config, backend, window)
        self.post_attention_layernorm = Float32RMSNorm(size, eps)
        self.mlp = BiasedTopKMoE(size, config.intermediate_size, config.num_experts, config.num_experts_per_tok,
                                 alpha=config.swiglu_alpha, limit=config.swiglu_limit)

    def forward(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv_cache: torch.Tensor,
                metadata: object) -> torch.Tensor:
        hidden = hidden + self.self_attn(self.input_layernorm(hidden), cos, sin, kv_cache, metadata)
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class GptOssModel(DecoderModel):
    layer_class = GptOssDecoderLayer
    norm_class = Float32RMSNorm


class GptOssForCausalLM(LlamaForCausalLM):
    """Serves GptOssForCausalLM checkpoints, unquantized or with MXFP4 experts."""

    decoder_class = GptOssModel
    config: GptOssConfig

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        super().load_weights(dequantized_experts(weights))


def dequantized_experts(weights: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    """Checkpoint tensors with each MXFP4 pair (`X_blocks`, `X_scales`, in either order) replaced by X.

    The pairs hold each expert's matrix output-major ([E, out, in / 32, 16]); X is input-major, as
    HF's experts keep it: "...experts.down_proj_blocks" [E, H, I/32, 16] -> "...experts.down_proj" [E, I, H].
    """
    pending: dict[str, torch.Tensor] = {}
    for name, tensor in weights:
        base, _, part = name.rpartition("_")
        if part not in ("blocks", "scales") or ".experts." not in name:
            yield name, tensor
            continue
        partner = f"{base}_{'scales' if part == 'blocks' else 'blocks'}"
        if partner not in pending:
            pending[name] = tensor
            continue
        blocks, scales = (tensor, pending.pop(partner)) if part == "blocks" else (pending.pop(partner), tensor)
        yield base, dequantize_mxfp4(blocks, scales).transpose(-2, -1)
    if pending:
        raise ValueError(f"MXFP4 tensors without their blocks or scales in the checkpoint: {sorted(pending)[:4]}")
