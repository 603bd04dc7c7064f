"""Tiny random-weight HF checkpoints for tests (Llama, llama3 rope, Qwen2, Qwen3, Mistral, Phi-3,
Mixtral, Gemma 2, OLMo 2, Granite, SmolLM3, GLM-4, Qwen3-MoE, Qwen2-MoE).

HF's default init (std 0.02, zero biases, unit norms) gives near-tied logits and leaves biases
and norm weights untested, so every parameter is re-drawn: matrices with std 1/sqrt(fan_in)
(activations stay O(1), logits spread by ~1), biases and norm weights around their defaults.
Stacked expert matrices [experts, out, in] count as matrices with fan_in = in; the router's
matrix gets the same std, so router logits spread by ~1 and tokens pick varied experts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import transformers
from transformers import GenerationConfig

EOS_TOKEN_ID = 2

_COMMON: dict[str, Any] = {
    "vocab_size": 512,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 1024,
    "rms_norm_eps": 1e-6,
    "bos_token_id": 1,
    "eos_token_id": EOS_TOKEN_ID,
}

# arch name -> (config class, model class, overrides)
_ARCHS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {"rope_theta": 10000.0}),
    "llama3": ("LlamaConfig", "LlamaForCausalLM", {
        "rope_theta": 500000.0,
        # original_max_position_embeddings small so all three llama3 bands (kept, interpolated,
        # divided by factor) occur at head_dim 16.
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
    }),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {"tie_word_embeddings": True, "rope_theta": 1000000.0}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 32, "rope_theta": 1000000.0,
                                                  "tie_word_embeddings": False}),
    # A window shorter than most test prompts (up to 80 tokens) and not a multiple of the block sizes.
    "mistral": ("MistralConfig", "MistralForCausalLM", {"sliding_window": 21, "rope_theta": 10000.0}),
    # Phi-3 convention: pad is eos. A window (32) shorter than the test prompts.
    "phi3": ("Phi3Config", "Phi3ForCausalLM", {"rope_theta": 10000.0, "sliding_window": 32,
                                               "pad_token_id": EOS_TOKEN_ID}),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", {"rope_theta": 1000000.0, "sliding_window": None,
                                                        "num_local_experts": 4, "num_experts_per_tok": 2}),
    # Both layer types twice; a window shorter than most test prompts (up to 80 tokens) and not a
    # multiple of the block sizes; heads * head_dim != hidden_size, and a scale not from head_dim.
    # The caps bite on these weights: attention scores have std ~5.6 (a third beyond 5), raw
    # logits top out at ~6 (capped to ~5.4); without the attention cap 2/3 of argmaxes change.
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", {
        "num_hidden_layers": 4, "head_dim": 32, "query_pre_attn_scalar": 16, "sliding_window": 19,
        "attn_logit_softcapping": 10.0, "final_logit_softcapping": 10.0, "rope_theta": 10000.0}),
    # Post-norms only, q/k norms over whole projections; a q/k bias as well (the HF class has the switch).
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", {"rope_theta": 10000.0, "attention_bias": True}),
    # Every multiplier away from 1; the attention scale (0.5) is not head_dim ** -0.5 (0.25).
    "granite": ("GraniteConfig", "GraniteForCausalLM", {
        "rope_theta": 10000.0, "embedding_multiplier": 2.0, "residual_multiplier": 0.6,
        "attention_multiplier": 0.5, "logits_scaling": 2.5}),
    # no_rope_layers [1, 0, 1, 0]: layers 1 and 3 attend without rope. Untied (its default is tied):
    # tied, greedy runs of 24 tokens held 1-5 distinct ones, untied 17-23.
    "smollm3": ("SmolLM3Config", "SmolLM3ForCausalLM", {
        "num_hidden_layers": 4, "no_rope_layer_interval": 2, "rope_theta": 10000.0, "pad_token_id": None,
        "tie_word_embeddings": False}),
    # Rope on half of each 32-dim head (16 dims, interleaved pairs); q/k/v biases (its default).
    "glm4": ("Glm4Config", "Glm4ForCausalLM", {
        "head_dim": 32, "partial_rotary_factor": 0.5, "rope_theta": 10000.0, "pad_token_id": None}),
    # Layers 0 and 2 sparse, 1 and 3 dense (mlp_only_layers); top-k weights not renormalised (its default).
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", {
        "num_hidden_layers": 4, "head_dim": 32, "rope_theta": 1000000.0, "num_experts": 8,
        "num_experts_per_tok": 2, "moe_intermediate_size": 32, "mlp_only_layers": [1, 3],
        "norm_topk_prob": False, "pad_token_id": None}),
    # decoder_sparse_step 2: layers 1 and 3 sparse, 0 and 2 dense; renormalised top-k weights; a
    # shared expert (96) wider than the routed ones (32), gated per token; q/k/v biases.
    "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM", {
        "num_hidden_layers": 4, "rope_theta": 1000000.0, "num_experts": 4, "num_experts_per_tok": 2,
        "moe_intermediate_size": 32, "shared_expert_intermediate_size": 96, "decoder_sparse_step": 2,
        "norm_topk_prob": True, "pad_token_id": None}),
}
ARCHS = tuple(_ARCHS)
# _randomize settings that differ by family. Gemma multiplies embeddings by sqrt(hidden_size), so
# std 1/sqrt(hidden_size) gives the O(1) activations that std 1 gives the others; with std 1 the
# input token would dominate the residual stream and the tied head would repeat it every step.
# (Its norms scale by 1 + weight: drawn around 1 like the others', they scale by ~2, which keeps
# the attention and MLP branches ahead of the embedding: greedy runs of 24 tokens hold 12-23
# distinct ones.)
_INIT: dict[str, dict[str, float]] = {"gemma2": {"embed_std": _COMMON["hidden_size"] ** -0.5}}


def _randomize(model: torch.nn.Module, seed: int, embed_std: float = 1.0) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.ndim >= 2:  # [out, in], or [experts, out, in]
                std = embed_std if "embed_tokens" in name else param.shape[-1] ** -0.5
                param.copy_(torch.randn(param.shape, generator=generator) * std)
            elif name.endswith("bias"):
                param.copy_(torch.randn(param.shape, generator=generator) * 0.1)
            else:  # norm weights
                param.copy_(1.0 + 0.1 * torch.randn(param.shape, generator=generator))


def make_tiny_hf_model(arch: str, path: str | Path, *, seed: int = 0, shard: bool = False,
                       **config_overrides: Any) -> Path:
    """Write a tiny float32 checkpoint of `arch` (one of ARCHS) to `path`; returns the path."""
    if arch not in _ARCHS:
        raise ValueError(f"arch must be one of {ARCHS}, got {arch!r}")
    config_name, model_name, arch_overrides = _ARCHS[arch]
    config = getattr(transformers, config_name)(**{**_COMMON, **arch_overrides, **config_overrides})
    torch.manual_seed(seed)
    model = getattr(transformers, model_name)(config).float().eval()
    _randomize(model, seed, **_INIT.get(arch, {}))
    path = Path(path)
    save_kwargs: dict[str, Any] = {"safe_serialization": True}
    if shard:
        save_kwargs["max_shard_size"] = "100KB"
    model.save_pretrained(path, **save_kwargs)
    GenerationConfig(bos_token_id=1, eos_token_id=[EOS_TOKEN_ID, 3]).save_pretrained(path)
    return path
