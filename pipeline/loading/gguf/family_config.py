"""config.json fields that only some families have, read from each family's own GGUF metadata.

Each function takes the file's metadata, the config built so far (HF names: hidden_size,
head_dim, ...) and the file's tensor names, and returns the fields to add (DROP removes one). What
llama.cpp does not record but assumes (llama-model.cpp's per-architecture hparams) is derived the way
llama.cpp derives it, so a file serves as llama.cpp serves it. Mixture-of-experts families: moe_config.py.
"""

from __future__ import annotations

from typing import Any

from pipeline.loading.gguf.metadata import GgufMetadata

# llama.cpp's defaults (llama_hparams) for caps a Gemma 2 file leaves out; also Gemma2Config's.
DROP = object()  # a field value: remove the key the generic config set (rope_theta when rope_parameters has it)

_GEMMA2_ATTN_SOFTCAP = 50.0
_GEMMA2_FINAL_SOFTCAP = 30.0
_GEMMA2_WINDOW = 4096  # every released Gemma 2's, and Gemma2Config's default
# llama.cpp recognises Gemma 2 27B by its layer count, and only there takes the attention scale from
# hidden_size / num_heads (144 for 27B, whose head_dim is 128); every other size uses head_dim.
_GEMMA2_27B_LAYERS = 46
_GEMMA3_27B_LAYERS = 62
_GEMMA3_PATTERN = 6  # llama.cpp's set_swa_pattern(6): five sliding layers, then a global one
_GEMMA3_LOCAL_THETA = 10_000.0  # llama.cpp's rope_freq_base_train_swa for gemma3
_SMOLLM3_NO_ROPE_STEP = 4  # llama.cpp's n_no_rope_layer_step for smollm3


def gemma2_fields(metadata: GgufMetadata, config: dict[str, Any], _names: set[str]) -> dict[str, Any]:
    """Soft caps, window, layer kinds and the attention scale of a `gemma2` file."""
    layers = config["num_hidden_layers"]
    return {
        "query_pre_attn_scalar": gemma2_query_pre_attn_scalar(config),
        "attn_logit_softcapping": float(metadata.arch("attn_logit_softcapping", _GEMMA2_ATTN_SOFTCAP)),
        "final_logit_softcapping": float(metadata.arch("final_logit_softcapping", _GEMMA2_FINAL_SOFTCAP)),
        "sliding_window": sliding_window(metadata) or _GEMMA2_WINDOW,
        # llama.cpp's swa pattern 2, HF's default too: even-indexed layers slide, odd ones see everything.
        "layer_types": ["full_attention" if index % 2 else "sliding_attention" for index in range(layers)],
    }


def gemma2_query_pre_attn_scalar(config: dict[str, Any], layers_27b: int = _GEMMA2_27B_LAYERS) -> int:
    """convert_hf_to_gguf.py does not store query_pre_attn_scalar; this is llama.cpp's assumption
    (llama-model.cpp, f_attention_scale), which agrees with the released 2B, 9B and 27B configs (and
    Gemma 3's: 27B has 62 layers there)."""
    if config["num_hidden_layers"] == layers_27b:
        return config["hidden_size"] // config["num_attention_heads"]
    return config["head_dim"]


def gemma3_fields(metadata: GgufMetadata, config: dict[str, Any], _names: set[str]) -> dict[str, Any]:
    """Layer kinds, the two ropes, the scale and the final cap of a `gemma3` file.

    llama.cpp makes every 6th layer global when the file records a window (none: all global), gives
    the sliding layers rope base 10000 unscaled, and the global ones the file's base and scaling
    (linear 8 on the released 4B-27B). Newer converters also record the sliding base
    (rope.freq_base_swa); it is read when there. Gemma 3 never caps attention logits.
    """
    window = sliding_window(metadata)
    layer_types = ["sliding_attention" if window and (index + 1) % _GEMMA3_PATTERN else "full_attention"
                   for index in range(config["num_hidden_layers"])]
    full = {"rope_type": "default", **(config.get("rope_scaling") or {}), "rope_theta": config["rope_theta"]}
    sliding = {"rope_type": "default", "rope_theta": float(metadata.arch("rope.freq_base_swa", _GEMMA3_LOCAL_THETA))}
    softcap = metadata.arch("final_logit_softcapping")
    return {
        "query_pre_attn_scalar": gemma2_query_pre_attn_scalar(config, _GEMMA3_27B_LAYERS),
        "sliding_window": window, "layer_types": layer_types,
        "rope_parameters": {"full_attention": full, "sliding_attention": sliding},
        "rope_scaling": DROP, "rope_theta": DROP,
        "final_logit_softcapping": float(softcap) if softcap else None,
    }


def gemma4_fields(metadata: GgufMetadata, config: dict[str, Any], names: set[str]) -> dict[str, Any]:
    """A `gemma4` file states per layer what HF's config derives: the kinds (sliding_window_pattern),
    the KV heads (head_count_kv list) and MLP widths (feed_forward_length list: the double-wide ones),
    the global and sliding head sizes (key_length, key_length_swa); the global layers' proportional
    rope is the rope_freqs tensor (hf_config.py). Values equal to keys are a global layer without
    attn_v; a layer without its own attn_k reuses an earlier one's (shared_kv_layers). The head sizes
    and KV heads go into transformers 5's per_layer_config."""
    if any(".ffn_gate_inp." in name for name in names):
        raise ValueError("this gemma4 file has experts (the 26B-A4B, enable_moe_block): Gemma 4's MoE variant "
                         "is not supported yet")
    kinds = ["sliding_attention" if sliding else "full_attention"
             for sliding in metadata.require_arch("attention.sliding_window_pattern")]
    layers = config["num_hidden_layers"]
    if len(kinds) != layers:
        raise ValueError(f"attention.sliding_window_pattern has {len(kinds)} entries for {layers} layers")
    kv_heads = _per_layer(metadata.arch("attention.head_count_kv", config["num_attention_heads"]), layers)
    widths = _per_layer(metadata.require_arch("feed_forward_length"), layers)
    sliding_dim = int(metadata.require_arch("attention.key_length_swa"))
    sliding_rotary = int(metadata.arch("rope.dimension_count_swa", sliding_dim))
    if sliding_rotary != sliding_dim:
        raise ValueError(f"rope.dimension_count_swa {sliding_rotary} is not the sliding head size {sliding_dim} "
                         "(partial rope on Gemma 4's sliding layers is not supported)")
    sliding = next((index for index, kind in enumerate(kinds) if kind == "sliding_attention"), 0)
    globals_ = [index for index, kind in enumerate(kinds) if kind == "full_attention"]
    if (config.get("rope_scaling") or {}).get("rope_type") != "proportional":
        raise ValueError("this gemma4 file has no rope_freqs tensor, which its converter always writes for the "
                         "global layers' proportional rope")
    full = {**config["rope_scaling"], "rope_theta": config["rope_theta"]}
    softcap = metadata.arch("final_logit_softcapping")
    return {
        "layer_types": kinds, "head_dim": sliding_dim, "num_key_value_heads": kv_heads[sliding],
        "per_layer_config": {str(index): {"head_dim": config["head_dim"], "num_key_value_heads": kv_heads[index]}
                             for index in globals_},
        "attention_k_eq_v": any(f"blk.{index}.attn_k.weight" in names and f"blk.{index}.attn_v.weight" not in names
                                for index in globals_),
        "num_kv_shared_layers": int(metadata.arch("attention.shared_kv_layers", 0)),
        "intermediate_size": min(widths), "use_double_wide_mlp": len(set(widths)) > 1,
        "hidden_size_per_layer_input": int(metadata.arch("embedding_length_per_layer_input", 0)),
        "sliding_window": sliding_window(metadata),
        "final_logit_softcapping": float(softcap) if softcap else None,
        "rope_parameters": {"full_attention": full, "sliding_attention": {
            "rope_type": "default", "rope_theta": float(metadata.arch("rope.freq_base_swa", _GEMMA3_LOCAL_THETA))}},
        "rope_scaling": DROP, "rope_theta": DROP,
    }


def _per_layer(value: Any, layers: int) -> list[int]:
    values = [int(item) for item in value] if isinstance(value, list) else [int(value)] * layers
    if len(values) != layers:
        raise ValueError(f"a per-layer list has {len(values)} entries for {layers} layers")
    return values


def olmo2_fields(metadata: GgufMetadata, config: dict[str, Any], _names: set[str]) -> dict[str, Any]:
    """OLMo 3 is written as `olmo2` with a window and its layer pattern; Olmo3ForCausalLM is not served."""
    if metadata.arch("attention.sliding_window"):
        raise ValueError("this olmo2 file records attention.sliding_window, which makes it OLMo 3 "
                         "(Olmo3ForCausalLM), an architecture that is not supported")
    return {}


def granite_fields(metadata: GgufMetadata, config: dict[str, Any], _names: set[str]) -> dict[str, Any]:
    """Granite's four multipliers, stored under llama.cpp's `*_scale` names (absent: HF's default, 1)."""
    keys = {"attention_multiplier": "attention.scale", "embedding_multiplier": "embedding_scale",
            "residual_multiplier": "residual_scale", "logits_scaling": "logit_scale"}
    return {hf: float(value) for hf, key in keys.items() if (value := metadata.arch(key)) is not None}


def smollm3_fields(metadata: GgufMetadata, config: dict[str, Any], _names: set[str]) -> dict[str, Any]:
    """The file records no NoPE layers: llama.cpp skips rope on every 4th layer (n_no_rope_layer_step,
    SmolLM3-3B's no_rope_layer_interval), as HF's default does."""
    layers = config["num_hidden_layers"]
    return {"no_rope_layer_interval": _SMOLLM3_NO_ROPE_STEP, "use_sliding_window": False,
            "no_rope_layers": [int((index + 1) % _SMOLLM3_NO_ROPE_STEP != 0) for index in range(layers)]}



def glm4_fields(metadata: GgufMetadata, config: dict[str, Any], _names: set[str]) -> dict[str, Any]:
    """GLM-4V's language model converts as `glm4` too, with M-RoPE sections and its Q/K rows reordered
    for llama.cpp's M-RoPE (Glm4Model.normal_to_neox); Glm4vForConditionalGeneration is not served."""
    if metadata.arch("rope.dimension_sections") is not None:
        raise ValueError("this glm4 file has M-RoPE sections (rope.dimension_sections): it is GLM-4V's language "
                         "model (Glm4vForConditionalGeneration), an architecture that is not supported")
    return {}


def phi3_fields(metadata: GgufMetadata, config: dict[str, Any], _names: set[str]) -> dict[str, Any]:
    # convert_hf_to_gguf.py writes 0 for "no window" (Phi-4).
    return {"sliding_window": sliding_window(metadata)}


def mistral_fields(metadata: GgufMetadata, config: dict[str, Any], _names: set[str]) -> dict[str, Any]:
    return {"sliding_window": sliding_window(metadata)}


def mixtral_fields(metadata: GgufMetadata, config: dict[str, Any], _names: set[str]) -> dict[str, Any]:
    experts, used = expert_counts(metadata)
    return {"num_local_experts": experts, "num_experts_per_tok": used, "sliding_window": sliding_window(metadata)}


def expert_counts(metadata: GgufMetadata) -> tuple[int, int]:
    """(expert_count, expert_used_count), checked."""
    used = int(metadata.require_arch("expert_used_count"))
    experts = int(metadata.require_arch("expert_count"))
    if not 0 < used <= experts:
        raise ValueError(f"expert_used_count must be in 1..expert_count ({experts}), got {used}")
    return experts, used


def sliding_window(metadata: GgufMetadata) -> int | None:
    """None when the file records no window or a window of 0."""
    window = metadata.arch("attention.sliding_window")
    return int(window) if window else None
