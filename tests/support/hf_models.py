"""Tiny random-weight HF checkpoints for tests (Llama, llama3 rope, Qwen2, Qwen3, Mistral, Phi-3,
Mixtral, Gemma 2, Gemma 3, Gemma 4 (text), OLMo 2, Granite, SmolLM3, GLM-4, Qwen3-MoE, Qwen2-MoE,
DeepSeek-V2, DeepSeek-V3, gpt-oss, Llama 4, Qwen3-Next, Qwen3.5, Qwen3.5-MoE).

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
    # Gemma 2's layout (window 19, scale 16 ** -0.5, heads * head_dim != hidden_size) with q/k norms and
    # a rope per layer type: sliding layers at base 1e4, global ones at 1e6 with linear scaling (as the
    # released 4B-27B); sliding_window_pattern 3 makes layer 2 the only global one (S S F S). No caps
    # (as released; HF's Gemma 3 attention ignores attn_logit_softcapping).
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", {
        "num_hidden_layers": 4, "head_dim": 32, "query_pre_attn_scalar": 16, "sliding_window": 19,
        "sliding_window_pattern": 3, "rope_parameters": {
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0}}}),
    # Every Gemma 4 part at once: 6 layers S S F S S F, global heads twice as wide (64) with one KV
    # head whose values are the keys' projection (attention_k_eq_v); layers 4 and 5 reuse layer 3's
    # and 2's keys and values (num_kv_shared_layers 2) with double-wide MLPs; per-layer inputs of 16
    # per layer; proportional rope on the global layers (its default: a quarter of the pairs turn).
    # Fixed layer count: check_fidelity.py keeps it.
    "gemma4": ("Gemma4TextConfig", "Gemma4ForCausalLM", {
        "num_hidden_layers": 6, "head_dim": 32, "global_head_dim": 64, "sliding_window": 19,
        "layer_types": ["sliding_attention", "sliding_attention", "full_attention"] * 2,
        "vocab_size_per_layer_input": 512, "hidden_size_per_layer_input": 16, "num_kv_shared_layers": 2,
        "attention_k_eq_v": True, "num_global_key_value_heads": 1, "use_double_wide_mlp": True,
        "final_logit_softcapping": 30.0}),
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
    # MLA (HF needs num_key_value_heads == num_attention_heads): 4 heads, a 32-value latent + 16 rope
    # values cached per token (nope 40, so qk_head_dim 56 differs from the row's 48; v 24), q_proj without
    # a q latent; layer 0 dense, 1 and 2
    # sparse: 8 experts in 4 groups, top 3 inside the best 2 groups (group_limited_greedy: with top 2
    # it always picks what greedy does), 2 shared experts, weights scaled by 1.5.
    "deepseek_v2": ("DeepseekV2Config", "DeepseekV2ForCausalLM", {
        "num_hidden_layers": 3, "num_key_value_heads": 4, "kv_lora_rank": 32, "q_lora_rank": None,
        "qk_rope_head_dim": 16, "qk_nope_head_dim": 40, "v_head_dim": 24, "n_routed_experts": 8,
        "num_experts_per_tok": 3, "moe_intermediate_size": 32, "n_shared_experts": 2,
        "first_k_dense_replace": 1, "topk_method": "group_limited_greedy", "n_group": 4, "topk_group": 2,
        "routed_scaling_factor": 1.5, "rope_theta": 10000.0, "pad_token_id": None}),
    # V3: a q latent (q_lora_rank 48), sigmoid scores with a correction bias (noaux_tc: the best 2 of
    # 4 groups), renormalised and scaled by 2.5; one shared expert; YaRN rope with both mscales.
    "deepseek_v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM", {
        "num_hidden_layers": 3, "num_key_value_heads": 4, "kv_lora_rank": 32, "q_lora_rank": 48,
        "qk_rope_head_dim": 16, "qk_nope_head_dim": 40, "v_head_dim": 24, "n_routed_experts": 8,
        "num_experts_per_tok": 2, "moe_intermediate_size": 32, "n_shared_experts": 1,
        "first_k_dense_replace": 1, "n_group": 4, "topk_group": 2, "routed_scaling_factor": 2.5,
        "norm_topk_prob": True, "pad_token_id": None,
        "rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                            "original_max_position_embeddings": 256, "beta_fast": 32, "beta_slow": 1,
                            "mscale": 1.0, "mscale_all_dim": 0.8}}),
    # Layers slide and attend fully in turn (S F S F), window 19 as Gemma 2's; 4 experts of 32, top 2; a
    # SwiGLU limit (1.5) that clamps part of the gate/up values (the released 7.0 never bites here);
    # YaRN over an original context of 128 (factor 8: cos/sin scaled by 1.21, the low frequencies
    # divided by 8). Sinks and router biases are drawn large (_INIT).
    "gpt_oss": ("GptOssConfig", "GptOssForCausalLM", {
        "num_hidden_layers": 4, "head_dim": 32, "sliding_window": 19, "intermediate_size": 32,
        "num_local_experts": 4, "num_experts_per_tok": 2, "swiglu_limit": 1.5, "pad_token_id": None,
        "rope_parameters": {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 8.0, "beta_fast": 32.0,
                            "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 128}}),
    # Layers 0 and 2 rotate (llama3 rope) and attend in chunks of 13 (shorter than most prompts, not a
    # multiple of the block sizes), with weightless q/k norms; 1 and 3 are NoPE (no_rope_layer_interval 2),
    # full attention, q scaled by position (floor_scale 4, attn_scale 0.5: 1.35 at position 3, 2.5 at 80).
    # Layers 1 and 2 are MoE: 4 experts of 32 and a shared one, top 2, sigmoid scores on the inputs;
    # 0 and 3 dense MLPs of 128. Experts input-major (_INIT).
    "llama4": ("Llama4TextConfig", "Llama4ForCausalLM", {
        "head_dim": 16, "intermediate_size": 32, "intermediate_size_mlp": 128, "no_rope_layer_interval": 2,
        "attention_chunk_size": 13, "floor_scale": 4, "attn_scale": 0.5, "num_local_experts": 4,
        "num_experts_per_tok": 2, "moe_layers": [1, 2], "num_hidden_layers": 4, "pad_token_id": None,
        "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                            "high_freq_factor": 4.0, "original_max_position_embeddings": 64}}),
}
# Qwen3-Next and Qwen3.5: linear-attention (gated DeltaNet) layers 0, 2 and 3 around a full-attention layer 1;
# 2 key heads serving 4 value heads each of another width than the keys (16 vs 24), so a transposed or
# ungrouped head shows; a conv window of 4; full attention with 32-wide heads, a quarter of them rotated.
_HYBRID: dict[str, Any] = {
    "num_hidden_layers": 4, "head_dim": 32, "intermediate_size": 96, "linear_num_key_heads": 2,
    "linear_num_value_heads": 4, "linear_key_head_dim": 16, "linear_value_head_dim": 24, "linear_conv_kernel_dim": 4,
    "layer_types": ["linear_attention", "full_attention", "linear_attention", "linear_attention"],
    "pad_token_id": None,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
}
_HYBRID_MOE: dict[str, Any] = {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                               "shared_expert_intermediate_size": 48}
# Qwen3-Next: layer 2 dense (mlp_only_layers), the others routed with a shared expert; Qwen3.5 dense;
# Qwen3.5-MoE routed on every layer.
_ARCHS["qwen3_next"] = ("Qwen3NextConfig", "Qwen3NextForCausalLM", {**_HYBRID, **_HYBRID_MOE, "mlp_only_layers": [2]})
_ARCHS["qwen3_5"] = ("Qwen3_5TextConfig", "Qwen3_5ForCausalLM", _HYBRID)
_ARCHS["qwen3_5_moe"] = ("Qwen3_5MoeTextConfig", "Qwen3_5MoeForCausalLM", {**_HYBRID, **_HYBRID_MOE})
ARCHS = tuple(_ARCHS)
RECURRENT_ARCHS = ("qwen3_next", "qwen3_5", "qwen3_5_moe")  # a state per sequence: no prefix caching
# _randomize settings that differ by family. Gemma multiplies embeddings by sqrt(hidden_size), so
# std 1/sqrt(hidden_size) gives the O(1) activations that std 1 gives the others; with std 1 the
# input token would dominate the residual stream and the tied head would repeat it every step.
# (Its norms scale by 1 + weight: drawn around 1 like the others', they scale by ~2, which keeps
# the attention and MLP branches ahead of the embedding: greedy runs of 24 tokens hold 12-23
# distinct ones.)
_INIT: dict[str, dict[str, Any]] = {gemma: {"embed_std": _COMMON["hidden_size"] ** -0.5}
                                    for gemma in ("gemma2", "gemma3", "gemma4")}
# gpt-oss: sink logits around 2 (spread 1), so sinks take a real share of a head's weight; router
# biases with std 1 route unevenly; its expert matrices are input-major ([experts, in, out]).
_INIT["gpt_oss"] = {"sink_mean": 2.0, "router_bias_std": 1.0, "input_major_experts": True}
_INIT["llama4"] = {"input_major_experts": True}  # feed_forward.experts: [experts, in, out]
# Qwen3-Next / Qwen3.5: gated DeltaNet decay rates A = exp(A_log) drawn from U(0.01, 1) (HF draws U(0.01, 16)):
# per token the state keeps exp(-A softplus(a + dt_bias)) of itself, from about 0.99 (long memory) down to
# about 0.05. Their zero-centred norms (scale 1 + weight) are drawn around their default, 0: around 1 (a
# scale of 2 at every norm and 4 on the attention scores) HF's own float32 logprobs drifted 2e-4 to 7e-4
# from its float64 ones over 120 tokens, past the 1e-4 the fidelity tests hold; so drawn, 1e-5.
for _hybrid in RECURRENT_ARCHS:
    _INIT[_hybrid] = {"decay_rates": (0.01, 1.0), "zero_centred_norms": True}


def _randomize(model: torch.nn.Module, seed: int, embed_std: float = 1.0, sink_mean: float = 0.0,
               router_bias_std: float = 0.1, input_major_experts: bool = False,
               decay_rates: tuple[float, float] = (0.01, 16.0), zero_centred_norms: bool = False) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("bias"):  # [out], or [experts, out]
                std = router_bias_std if ".router." in name else 0.1
                param.copy_(torch.randn(param.shape, generator=generator) * std)
            elif param.ndim >= 2:  # [out, in], or [experts, out, in]
                fan_in = param.shape[-2] if input_major_experts and ".experts." in name else param.shape[-1]
                std = embed_std if "embed_tokens" in name else fan_in**-0.5
                param.copy_(torch.randn(param.shape, generator=generator) * std)
            elif name.endswith("sinks"):  # attention sink logits, one per head
                param.copy_(sink_mean + torch.randn(param.shape, generator=generator))
            elif name.endswith("A_log"):  # gated DeltaNet's log decay rates, one per value head
                low, high = decay_rates
                param.copy_((low + (high - low) * torch.rand(param.shape, generator=generator)).log())
            elif zero_centred_norms and name.endswith("norm.weight") and "linear_attn" not in name:
                param.copy_(0.1 * torch.randn(param.shape, generator=generator))  # scale 1 + weight
            else:  # norm weights
                param.copy_(1.0 + 0.1 * torch.randn(param.shape, generator=generator))
        for name, buffer in model.named_buffers():
            if name.endswith("e_score_correction_bias"):  # DeepSeek-V3's routing bias, zero in HF's init
                buffer.copy_(0.2 * torch.randn(buffer.shape, generator=generator))
            elif name.endswith("layer_scalar"):  # Gemma 4's per-layer output scale: a saved buffer, 1 in HF's init
                buffer.copy_(1.0 + 0.2 * torch.randn(buffer.shape, generator=generator))


def tiny_config(arch: str, **config_overrides: Any) -> transformers.PretrainedConfig:
    """The HF config of `arch` (one of ARCHS) that make_tiny_hf_model writes."""
    if arch not in _ARCHS:
        raise ValueError(f"arch must be one of {ARCHS}, got {arch!r}")
    config_name, _, arch_overrides = _ARCHS[arch]
    return getattr(transformers, config_name)(**{**_COMMON, **arch_overrides, **config_overrides})


def make_tiny_hf_model(arch: str, path: str | Path, *, seed: int = 0, shard: bool = False,
                       **config_overrides: Any) -> Path:
    """Write a tiny float32 checkpoint of `arch` (one of ARCHS) to `path`; returns the path."""
    config = tiny_config(arch, **config_overrides)
    torch.manual_seed(seed)
    model = getattr(transformers, _ARCHS[arch][1])(config).float().eval()
    _randomize(model, seed, **_INIT.get(arch, {}))
    path = Path(path)
    save_kwargs: dict[str, Any] = {"safe_serialization": True}
    if shard:
        save_kwargs["max_shard_size"] = "100KB"
    model.save_pretrained(path, **save_kwargs)
    GenerationConfig(bos_token_id=1, eos_token_id=[EOS_TOKEN_ID, 3]).save_pretrained(path)
    return path
