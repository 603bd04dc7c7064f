"""config.json fields that only some families have, read from each family's own GGUF metadata.

Each function takes the file's metadata and the config built so far (HF names: hidden_size,
head_dim, ...) and returns the fields to add. What llama.cpp does not record but assumes is
derived the way llama.cpp derives it, so a file serves as llama.cpp serves it.
"""

from __future__ import annotations

from typing import Any

from pipeline.loading.gguf.metadata import GgufMetadata

# llama.cpp's defaults (llama_hparams) for caps a Gemma 2 file leaves out; also Gemma2Config's.
_GEMMA2_ATTN_SOFTCAP = 50.0
_GEMMA2_FINAL_SOFTCAP = 30.0
_GEMMA2_WINDOW = 4096  # every released Gemma 2's, and Gemma2Config's default
# llama.cpp recognises Gemma 2 27B by its layer count, and only there takes the attention scale from
# hidden_size / num_heads (144 for 27B, whose head_dim is 128); every other size uses head_dim.
_GEMMA2_27B_LAYERS = 46


def gemma2_fields(metadata: GgufMetadata, config: dict[str, Any]) -> dict[str, Any]:
    """Soft caps, window, layer kinds and the attention scale of a `gemma2` file."""
    layers = config["num_hidden_layers"]
    return {
        "query_pre_attn_scalar": gemma2_query_pre_attn_scalar(config),
        "attn_logit_softcapping": float(metadata.arch("attn_logit_softcapping", _GEMMA2_ATTN_SOFTCAP)),
        "final_logit_softcapping": float(metadata.arch("final_logit_softcapping", _GEMMA2_FINAL_SOFTCAP)),
        "sliding_window": _sliding_window(metadata) or _GEMMA2_WINDOW,
        # llama.cpp's swa pattern 2, HF's default too: even-indexed layers slide, odd ones see everything.
        "layer_types": ["full_attention" if index % 2 else "sliding_attention" for index in range(layers)],
    }


def gemma2_query_pre_attn_scalar(config: dict[str, Any]) -> int:
    """convert_hf_to_gguf.py does not store query_pre_attn_scalar; this is llama.cpp's assumption
    (llama-model.cpp, f_attention_scale), which agrees with the released 2B, 9B and 27B configs."""
    if config["num_hidden_layers"] == _GEMMA2_27B_LAYERS:
        return config["hidden_size"] // config["num_attention_heads"]
    return config["head_dim"]


def phi3_fields(metadata: GgufMetadata, config: dict[str, Any]) -> dict[str, Any]:
    # convert_hf_to_gguf.py writes 0 for "no window" (Phi-4).
    return {"sliding_window": _sliding_window(metadata)}


def mistral_fields(metadata: GgufMetadata, config: dict[str, Any]) -> dict[str, Any]:
    return {"sliding_window": _sliding_window(metadata)}


def mixtral_fields(metadata: GgufMetadata, config: dict[str, Any]) -> dict[str, Any]:
    used = int(metadata.require_arch("expert_used_count"))
    experts = int(metadata.require_arch("expert_count"))
    if not 0 < used <= experts:
        raise ValueError(f"expert_used_count must be in 1..expert_count ({experts}), got {used}")
    return {"num_local_experts": experts, "num_experts_per_tok": used, "sliding_window": _sliding_window(metadata)}


def _sliding_window(metadata: GgufMetadata) -> int | None:
    """None when the file records no window or a window of 0."""
    window = metadata.arch("attention.sliding_window")
    return int(window) if window else None
