"""config.json and generation_config.json for a GGUF file, from its metadata (HF field names)."""

from __future__ import annotations

from typing import Any

import numpy as np

from pipeline.loading.gguf.architectures import GgufArchitecture
from pipeline.loading.gguf.metadata import GgufMetadata
from pipeline.loading.gguf.rope_scaling import llama3_rope_scaling


def hf_config(metadata: GgufMetadata, arch: GgufArchitecture, tensor_names: set[str],
              rope_freqs: np.ndarray | None, dtype_name: str) -> dict[str, Any]:
    """The HF config.json dict; ValueError for anything the engine's HF classes cannot express."""
    _refuse_longrope(tensor_names)
    num_heads = int(metadata.require_arch("attention.head_count"))
    hidden_size = int(metadata.require_arch("embedding_length"))
    head_dim = _head_dim(metadata, hidden_size, num_heads)
    theta = float(metadata.arch("rope.freq_base", 10000.0))
    config: dict[str, Any] = {
        "architectures": [arch.hf_architecture],
        "model_type": arch.model_type,
        "vocab_size": _vocab_size(metadata),
        "hidden_size": hidden_size,
        "intermediate_size": int(metadata.require_arch("feed_forward_length")),
        "num_hidden_layers": int(metadata.require_arch("block_count")),
        "num_attention_heads": num_heads,
        "num_key_value_heads": _num_kv_heads(metadata, num_heads),
        "head_dim": head_dim,
        "max_position_embeddings": int(metadata.require_arch("context_length")),
        "rms_norm_eps": float(metadata.require_arch("attention.layer_norm_rms_epsilon")),
        "rope_theta": theta,
        "rope_scaling": _rope_scaling(metadata, rope_freqs, theta, head_dim),
        # llama.cpp writes an output projection only when it is not the embedding matrix.
        "tie_word_embeddings": "output.weight" not in tensor_names,
        "attention_bias": "blk.0.attn_q.bias" in tensor_names,
        "mlp_bias": "blk.0.ffn_up.bias" in tensor_names,
        "hidden_act": "silu",
        "torch_dtype": dtype_name,
        **_token_ids(metadata),
        **arch.config_values,
    }
    if arch.family_fields is not None:
        config.update(arch.family_fields(metadata, config))
    return {key: value for key, value in config.items() if value is not None}


def generation_config(metadata: GgufMetadata) -> dict[str, Any]:
    """EOS from the tokenizer metadata, plus llama.cpp's end-of-turn/message tokens: llama.cpp stops
    on all of them (e.g. Llama 3's <|eot_id|>), as the original repos' generation configs do."""
    ids = _token_ids(metadata)
    eos = [metadata.get(f"tokenizer.ggml.{name}_token_id") for name in ("eos", "eot", "eom")]
    eos_ids = list(dict.fromkeys(int(token) for token in eos if token is not None))
    config: dict[str, Any] = {"bos_token_id": ids.get("bos_token_id"), "pad_token_id": ids.get("pad_token_id")}
    if eos_ids:
        config["eos_token_id"] = eos_ids[0] if len(eos_ids) == 1 else eos_ids
    return {key: value for key, value in config.items() if value is not None}


def _token_ids(metadata: GgufMetadata) -> dict[str, int]:
    names = {"bos_token_id": "bos", "eos_token_id": "eos", "pad_token_id": "padding"}
    return {hf: int(value) for hf, gguf in names.items()
            if (value := metadata.get(f"tokenizer.ggml.{gguf}_token_id")) is not None}


def _head_dim(metadata: GgufMetadata, hidden_size: int, num_heads: int) -> int:
    head_dim = int(metadata.arch("attention.key_length") or hidden_size // num_heads)
    value_dim = metadata.arch("attention.value_length")
    if value_dim is not None and int(value_dim) != head_dim:
        raise ValueError(f"attention.value_length {value_dim} differs from key_length {head_dim}; not supported")
    rotary_dims = metadata.arch("rope.dimension_count")
    if rotary_dims is not None and int(rotary_dims) != head_dim:
        raise ValueError(f"rope.dimension_count {rotary_dims} is not the head size {head_dim} "
                         "(partial rotary embeddings are not supported)")
    return head_dim


def _num_kv_heads(metadata: GgufMetadata, num_heads: int) -> int:
    value = metadata.arch("attention.head_count_kv", num_heads)
    if isinstance(value, list):  # some files give one count per layer
        if len(set(value)) != 1:
            raise ValueError(f"attention.head_count_kv differs between layers ({sorted(set(value))}); not supported")
        value = value[0]
    return int(value)


def _vocab_size(metadata: GgufMetadata) -> int | None:
    """None when the metadata does not say (the embedding's rows then decide)."""
    size = metadata.arch("vocab_size") or metadata.array_length("tokenizer.ggml.tokens")
    return None if size is None else int(size)


def _refuse_longrope(tensor_names: set[str]) -> None:
    """convert_hf_to_gguf.py stores LongRoPE (Phi-3 128k, Phi-3.5) as per-frequency factor tensors."""
    if {"rope_factors_long.weight", "rope_factors_short.weight"} & tensor_names:
        raise ValueError("this GGUF uses LongRoPE scaling (rope_factors_long/short tensors), which is not supported: "
                         "HF switches between its short and long factors per batch, which a paged cache cannot "
                         "reproduce token for token")


def _rope_scaling(metadata: GgufMetadata, rope_freqs: np.ndarray | None, theta: float,
                  head_dim: int) -> dict[str, Any] | None:
    scaling_type = metadata.arch("rope.scaling.type")
    if scaling_type == "linear" and float(metadata.arch("rope.scaling.factor", 1.0)) == 1.0:
        scaling_type = None  # stated, but a factor of 1 scales nothing
    if scaling_type not in (None, "none"):
        raise ValueError(f"rope scaling {scaling_type!r} is not supported (only llama3-style rope_freqs)")
    if rope_freqs is None:
        return None
    return llama3_rope_scaling(rope_freqs, theta, head_dim)
