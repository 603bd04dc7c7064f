"""config.json and generation_config.json for a GGUF file, from its metadata (HF field names)."""

from __future__ import annotations

from typing import Any

import numpy as np

from pipeline.loading.gguf.architectures import GgufArchitecture
from pipeline.loading.gguf.family_config import DROP
from pipeline.loading.gguf.metadata import GgufMetadata
from pipeline.loading.gguf.rope_scaling import llama3_rope_scaling


def hf_config(metadata: GgufMetadata, arch: GgufArchitecture, tensor_names: set[str],
              rope_freqs: np.ndarray | None, dtype_name: str) -> dict[str, Any]:
    """The HF config.json dict; ValueError for anything the engine's HF classes cannot express."""
    _refuse_longrope(tensor_names)
    num_heads = int(metadata.require_arch("attention.head_count"))
    hidden_size = int(metadata.require_arch("embedding_length"))
    head_dim, rotary_dims = _head_dim(metadata, hidden_size, num_heads, arch.rotary)
    theta = float(metadata.arch("rope.freq_base", 10000.0))
    config: dict[str, Any] = {
        "architectures": [arch.hf_architecture],
        "model_type": arch.model_type,
        "vocab_size": _vocab_size(metadata),
        "hidden_size": hidden_size,
        "intermediate_size": _uniform(metadata, "feed_forward_length", None, arch.per_layer_shapes),
        "num_hidden_layers": int(metadata.require_arch("block_count")),
        "num_attention_heads": num_heads,
        "num_key_value_heads": _uniform(metadata, "attention.head_count_kv", num_heads, arch.per_layer_shapes),
        "head_dim": head_dim,
        "max_position_embeddings": int(metadata.require_arch("context_length")),
        "rms_norm_eps": float(metadata.require_arch("attention.layer_norm_rms_epsilon")),
        "rope_theta": theta,
        "rope_scaling": _rope_scaling(metadata, rope_freqs, theta, rotary_dims, arch.rotary),
        # llama.cpp writes an output projection only when it is not the embedding matrix.
        "tie_word_embeddings": "output.weight" not in tensor_names,
        "attention_bias": "blk.0.attn_q.bias" in tensor_names,
        "mlp_bias": "blk.0.ffn_up.bias" in tensor_names,
        "hidden_act": "silu",
        "torch_dtype": dtype_name,
        **_token_ids(metadata),
        **arch.config_values,
    }
    if arch.rotary == "partial":
        config["partial_rotary_factor"] = rotary_dims / head_dim
    config = {key: value for key, value in config.items() if value is not None}
    if arch.family_fields is not None:  # a None there is an explicit null; DROP removes the key
        config.update(arch.family_fields(metadata, config, tensor_names))
    return {key: value for key, value in config.items() if value is not DROP}


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


def _head_dim(metadata: GgufMetadata, hidden_size: int, num_heads: int, rotary: str) -> tuple[int, int]:
    """(head size, rotary dims). A latent-attention file's sizes are its family's to read (moe_config.py)."""
    head_dim = int(metadata.arch("attention.key_length") or hidden_size // num_heads)
    stated_rotary = metadata.arch("rope.dimension_count")
    rotary_dims = head_dim if stated_rotary is None else int(stated_rotary)
    if rotary == "latent":
        return rotary_dims, rotary_dims
    value_dim = metadata.arch("attention.value_length")
    if value_dim is not None and int(value_dim) != head_dim:
        raise ValueError(f"attention.value_length {value_dim} differs from key_length {head_dim}; not supported")
    if rotary_dims != head_dim and rotary != "partial":
        raise ValueError(f"rope.dimension_count {rotary_dims} is not the head size {head_dim} "
                         "(partial rotary embeddings are not supported for this architecture)")
    if not 0 < rotary_dims <= head_dim or rotary_dims % 2:
        raise ValueError(f"rope.dimension_count {rotary_dims} must be even and in 2..head size {head_dim}")
    return head_dim, rotary_dims


def _uniform(metadata: GgufMetadata, key: str, default: int | None, per_layer: bool) -> int:
    """A size some files give per layer: one value, or the first of a list when the family reads the
    list itself (per_layer); ValueError for a list that varies otherwise."""
    value = metadata.arch(key, default) if default is not None else metadata.require_arch(key)
    if isinstance(value, list):
        if len(set(value)) != 1 and not per_layer:
            raise ValueError(f"{key} differs between layers ({sorted(set(value))}); not supported")
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
                  rotary_dims: int, rotary: str) -> dict[str, Any] | None:
    """HF's rope_scaling for the file's `rope.scaling.*` keys (linear, YaRN) or its llama3 `rope_freqs`."""
    scaling_type = metadata.arch("rope.scaling.type")
    factor = float(metadata.arch("rope.scaling.factor", 1.0))
    if scaling_type in ("linear", "yarn") and factor == 1.0:
        scaling_type = None  # stated, but a factor of 1 scales nothing
    if scaling_type == "linear":
        return {"rope_type": "linear", "factor": factor}
    if scaling_type == "yarn":
        return _yarn(metadata, factor)
    if scaling_type not in (None, "none"):
        raise ValueError(f"rope scaling {scaling_type!r} is not supported (only linear, yarn and llama3-style "
                         "rope_freqs)")
    if rope_freqs is None:
        return None
    if rotary == "proportional":
        return _proportional(rope_freqs, rotary_dims)
    return llama3_rope_scaling(rope_freqs, theta, rotary_dims)


def _proportional(rope_freqs: np.ndarray, rotary_dims: int) -> dict[str, Any]:
    """Gemma 4's global rope as its converter stores it: divisor 1 for each pair that turns, 1e30
    (frozen) for the rest, which must be the trailing ones (HF turns the first fraction)."""
    turning = rope_freqs.reshape(-1) == 1.0
    count = int(turning.sum())
    if rope_freqs.size != rotary_dims // 2 or not turning[:count].all() or turning[count:].any():
        raise ValueError("this GGUF's rope_freqs is not proportional rope (leading pairs turning, the rest frozen)")
    return {"rope_type": "proportional", "partial_rotary_factor": 2 * count / rotary_dims}


def _yarn(metadata: GgufMetadata, factor: float) -> dict[str, Any]:
    """What the converter wrote of HF's YaRN settings (conversion/base.py TextModel.set_gguf_parameters)."""
    extrapolation = metadata.arch("rope.scaling.yarn_ext_factor")
    if extrapolation is not None and float(extrapolation) not in (-1.0, 1.0):
        raise ValueError(f"rope.scaling.yarn_ext_factor {extrapolation} is not supported (HF's YaRN has none)")
    scaling: dict[str, Any] = {"rope_type": "yarn", "factor": factor,
                               "original_max_position_embeddings": int(
                                   metadata.require_arch("rope.scaling.original_context_length"))}
    for key, hf_key in (("yarn_beta_fast", "beta_fast"), ("yarn_beta_slow", "beta_slow"),
                        ("yarn_attn_factor", "attention_factor")):
        if (value := metadata.arch(f"rope.scaling.{key}")) is not None:
            scaling[hf_key] = float(value)
    return scaling
