"""config.json fields of the mixture-of-experts families, from their GGUF metadata and tensor names.

As in family_config.py (same signature): what the file records is read, what llama.cpp assumes for
the architecture (llama-model.cpp's hparams, the graph builders' constants) is assumed the same
way. Where a layer is dense or sparse, the file's tensors say so (a router `ffn_gate_inp` or not),
which is what llama.cpp's converters wrote for the HF checkpoint.
"""

from __future__ import annotations

from typing import Any

from pipeline.loading.gguf.family_config import DROP, expert_counts, sliding_window
from pipeline.loading.gguf.metadata import GgufMetadata

_GPT_OSS_SWIGLU_LIMIT = 7.0  # llama.cpp's LLM_FFN_SWIGLU_OAI_MOE limit; gpt-oss files record none
_YARN_LOG_MUL_PER_MSCALE = 0.1  # DeepseekV2Model writes yarn_log_multiplier = 0.1 * mscale_all_dim
_LLAMA4_NO_ROPE_STEP = 4  # llama.cpp's n_no_rope_layer_step (and swa pattern) for chunked llama4 files
_LLAMA4_CHUNK = 8192  # llama.cpp's n_swa for llama4: Scout's and Maverick's attention_chunk_size
_LLAMA4_FLOOR_SCALE, _LLAMA4_ATTN_SCALE = 8192, 0.1  # llama.cpp's temperature tuning, Llama4TextConfig's too
_LLAMA4_128E = 128  # llama.cpp turns the q/k norm off for the 128-expert model (Maverick), as its config does


def _rope_parameters(config: dict[str, Any]) -> dict[str, Any]:
    """The generic rope_scaling and rope_theta as one transformers-5 rope_parameters dict."""
    return {**(config.get("rope_scaling") or {"rope_type": "default"}), "rope_theta": config["rope_theta"]}


def _sparse_layers(config: dict[str, Any], tensor_names: set[str]) -> list[int]:
    return [index for index in range(config["num_hidden_layers"]) if f"blk.{index}.ffn_gate_inp.weight" in tensor_names]


def qwen_moe_fields(metadata: GgufMetadata, config: dict[str, Any], tensor_names: set[str]) -> dict[str, Any]:
    """Qwen3-MoE and Qwen2-MoE. llama.cpp renormalises the top-k weights for qwen3moe and not for
    qwen2moe (both constants in its graphs; every released model agrees); a file may state it
    (expert_weights_norm). Layers without a router are HF's mlp_only_layers."""
    experts, used = expert_counts(metadata)
    sparse = set(_sparse_layers(config, tensor_names))
    qwen2 = metadata.architecture == "qwen2moe"
    fields: dict[str, Any] = {
        "num_experts": experts, "num_experts_per_tok": used,
        "moe_intermediate_size": int(metadata.require_arch("expert_feed_forward_length")),
        "decoder_sparse_step": 1,
        "mlp_only_layers": [index for index in range(config["num_hidden_layers"]) if index not in sparse],
        "norm_topk_prob": bool(metadata.arch("expert_weights_norm", not qwen2)),
        "use_sliding_window": False,
    }
    if qwen2:
        fields["shared_expert_intermediate_size"] = int(metadata.require_arch("expert_shared_feed_forward_length"))
        fields["qkv_bias"] = config["attention_bias"]
    return fields


def gpt_oss_fields(metadata: GgufMetadata, config: dict[str, Any], _tensor_names: set[str]) -> dict[str, Any]:
    """Experts of expert_feed_forward_length, every other layer sliding (llama.cpp's swa pattern 2,
    HF's default), YaRN without truncating the ramp (GptOssConfig's `truncate: false`)."""
    experts, used = expert_counts(metadata)
    window = sliding_window(metadata)
    if window is None:
        raise ValueError("a gpt-oss file must record attention.sliding_window (llama.cpp requires it too)")
    rope = _rope_parameters(config)
    if rope["rope_type"] == "yarn":
        rope["truncate"] = False
    limits = metadata.arch("swiglu_clamp_exp")
    if isinstance(limits, list) and len(set(limits)) > 1:
        raise ValueError(f"swiglu_clamp_exp differs between layers ({sorted(set(limits))}); not supported")
    limit = float(limits[0] if isinstance(limits, list) else limits) if limits else _GPT_OSS_SWIGLU_LIMIT
    return {
        "num_local_experts": experts, "num_experts_per_tok": used,
        "intermediate_size": int(metadata.require_arch("expert_feed_forward_length")),
        "sliding_window": window,
        "layer_types": ["sliding_attention" if index % 2 == 0 else "full_attention"
                        for index in range(config["num_hidden_layers"])],
        "rope_parameters": rope, "rope_scaling": DROP, "rope_theta": DROP, "swiglu_limit": limit,
    }


def deepseek2_fields(metadata: GgufMetadata, config: dict[str, Any], tensor_names: set[str]) -> dict[str, Any]:
    """DeepSeek-V2 or V3 (sigmoid gating, or a routing bias `exp_probs_b`), with MLA's sizes.

    Since 2025 the converter writes MLA as MQA over the latent: head_count_kv 1, key_length
    kv_lora_rank + rope, value_length kv_lora_rank, and the per-head sizes as key/value_length_mla;
    older files give the per-head sizes as key/value_length.
    """
    rope_dims = int(metadata.require_arch("rope.dimension_count"))
    if (key_mla := metadata.arch("attention.key_length_mla")) is not None:
        key_size, value_size = int(key_mla), int(metadata.require_arch("attention.value_length_mla"))
    else:
        key_size, value_size = int(metadata.require_arch("attention.key_length")), int(
            metadata.require_arch("attention.value_length"))
    q_rank = metadata.arch("attention.q_lora_rank")
    v3 = metadata.arch("expert_gating_func") == 2 or any(".exp_probs_b." in name for name in tensor_names)
    experts, used = expert_counts(metadata)
    groups, used_groups = (int(metadata.arch(key) or 1) for key in ("expert_group_count", "expert_group_used_count"))
    return {
        "architectures": ["DeepseekV3ForCausalLM" if v3 else "DeepseekV2ForCausalLM"],
        "model_type": "deepseek_v3" if v3 else "deepseek_v2",
        "num_key_value_heads": config["num_attention_heads"], "head_dim": rope_dims,
        "kv_lora_rank": int(metadata.require_arch("attention.kv_lora_rank")),
        "q_lora_rank": int(q_rank) if q_rank else None,
        "qk_rope_head_dim": rope_dims, "qk_nope_head_dim": key_size - rope_dims, "v_head_dim": value_size,
        "first_k_dense_replace": int(metadata.arch("leading_dense_block_count", 0)),
        "n_routed_experts": experts, "num_experts_per_tok": used,
        "moe_intermediate_size": int(metadata.require_arch("expert_feed_forward_length")),
        "n_shared_experts": int(metadata.arch("expert_shared_count", 0)),
        "routed_scaling_factor": float(metadata.arch("expert_weights_scale", 1.0)),
        "norm_topk_prob": bool(metadata.arch("expert_weights_norm", False)),
        "scoring_func": "sigmoid" if v3 else "softmax",
        "topk_method": "noaux_tc" if v3 else ("group_limited_greedy" if groups > 1 else "greedy"),
        "n_group": groups, "topk_group": used_groups, "attention_bias": False,
        "rope_parameters": _deepseek_rope(metadata, config), "rope_scaling": DROP, "rope_theta": DROP,
    }


def _deepseek_rope(metadata: GgufMetadata, config: dict[str, Any]) -> dict[str, Any]:
    """YaRN with HF's mscale and mscale_all_dim equal (every released model's): the file keeps only
    0.1 * mscale_all_dim, and llama.cpp then leaves cos/sin unscaled and scales the softmax by
    mscale_all_dim's factor squared, which is what HF does when the two are equal."""
    scaling = config.get("rope_scaling")
    if not scaling:
        return {"rope_type": "default", "rope_theta": config["rope_theta"]}
    if scaling["rope_type"] != "yarn":
        raise ValueError(f"DeepSeek rope scaling {scaling['rope_type']!r} is not supported (only yarn)")
    log_mul = float(metadata.arch("rope.scaling.yarn_log_multiplier", 0.0))
    if not log_mul:  # llama.cpp: no softmax scaling, cos/sin unscaled
        return {**scaling, "rope_theta": config["rope_theta"], "attention_factor": 1.0}
    mscale = round(log_mul / _YARN_LOG_MUL_PER_MSCALE, 6)  # the float32 key, back to the config's decimal
    return {**scaling, "rope_theta": config["rope_theta"], "mscale": mscale, "mscale_all_dim": mscale}


def llama4_fields(metadata: GgufMetadata, config: dict[str, Any], tensor_names: set[str]) -> dict[str, Any]:
    """Llama 4 text. llama.cpp's assumptions: chunks of 8192 on three layers of four, the fourth
    NoPE and global, with temperature tuning (floor 8192, scale 0.1); a recorded window of 0 means
    no chunks and rope everywhere (MobileLLM); q/k norms except on the 128-expert model."""
    experts, used = expert_counts(metadata)
    layers = config["num_hidden_layers"]
    window = metadata.arch("attention.sliding_window")
    chunked = window is None or int(window) != 0
    rope_layers = [int(not chunked or (index + 1) % _LLAMA4_NO_ROPE_STEP != 0) for index in range(layers)]
    return {
        "intermediate_size": int(metadata.require_arch("expert_feed_forward_length")),
        "intermediate_size_mlp": config["intermediate_size"],
        "num_local_experts": experts, "num_experts_per_tok": used,
        "interleave_moe_layer_step": int(metadata.require_arch("interleave_moe_layer_step")),
        "moe_layers": _sparse_layers(config, tensor_names),
        "no_rope_layers": rope_layers,
        "layer_types": ["chunked_attention" if rope and chunked else "full_attention" for rope in rope_layers],
        "attention_chunk_size": _LLAMA4_CHUNK, "attn_temperature_tuning": chunked,
        "floor_scale": _LLAMA4_FLOOR_SCALE, "attn_scale": _LLAMA4_ATTN_SCALE,
        "use_qk_norm": experts != _LLAMA4_128E,
        "rope_parameters": _rope_parameters(config), "rope_scaling": DROP, "rope_theta": DROP,
    }
