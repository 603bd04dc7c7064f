"""Llama 4's settings from config.json, as transformers' Llama4TextConfig derives them (llama4.py serves them).

- A Llama4ForConditionalGeneration config's language model is its `text_config`; keys a config
  leaves out take Llama4TextConfig's defaults (_DEFAULTS), and an explicit null stays null
  (`attention_chunk_size: null` turns chunking off, `head_dim: null` means hidden_size / heads).
- Rope layers: `no_rope_layers` has one entry per layer, 1 = the layer *uses* rope (the name is
  HF's); missing or empty, every `no_rope_layer_interval`-th layer (default 4) goes without:
  [1, 1, 1, 0, 1, 1, 1, 0, ...].
- Layer kinds: `layer_types` when given, else `chunked_attention` for rope layers when
  `attention_chunk_size` is set and `full_attention` for the rest (the NoPE layers see the whole
  context); a chunked layer's window is a Chunk (attention/windows.py).
- MoE layers: `moe_layers` when given (even empty), else every `interleave_moe_layer_step`-th layer
  (step - 1, 2 * step - 1, ...); MoE layers have `num_local_experts` experts and a shared expert, all
  of `intermediate_size`; the other layers a dense MLP of `intermediate_size_mlp`.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

from pipeline.model.models import llama
from pipeline.model.models.llama import DecoderConfig

MULTIMODAL = "Llama4ForConditionalGeneration"

# Llama4TextConfig's defaults for keys a config.json may leave out.
_DEFAULTS: dict[str, Any] = {
    "vocab_size": 202_048, "hidden_size": 5120, "intermediate_size": 8192, "intermediate_size_mlp": 16_384,
    "num_hidden_layers": 48, "num_attention_heads": 40, "num_key_value_heads": 8, "head_dim": 128,
    "hidden_act": "silu", "max_position_embeddings": 131_072, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
    "num_experts_per_tok": 1, "num_local_experts": 16, "interleave_moe_layer_step": 1, "use_qk_norm": True,
    "no_rope_layer_interval": 4, "attention_chunk_size": 8192, "attn_temperature_tuning": True,
    "floor_scale": 8192, "attn_scale": 0.1, "attention_bias": False, "rope_theta": 500_000.0,
}


@dataclass(frozen=True, slots=True)
class Llama4Config(DecoderConfig):
    dense_intermediate_size: int = 0  # intermediate_size_mlp; experts use intermediate_size
    rope_layers: tuple[bool, ...] = ()  # per layer: rotates q and k (False: a NoPE layer)
    moe_layers: tuple[bool, ...] = ()  # per layer: experts (True) or a dense MLP
    l2_qk_norm: bool = False  # use_qk_norm: weightless RMS norm of q and k after rope, on rope layers
    temperature_tuning: bool = False  # attn_temperature_tuning: NoPE layers scale q by position
    floor_scale: float = 8192.0
    attn_scale: float = 0.1


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The language model's config.json with Llama4TextConfig's defaults and derived lists filled in."""
    architecture = config["architectures"][0]
    if architecture == MULTIMODAL:
        text = config.get("text_config") or {}
        config = {**text, "architectures": [architecture],
                  "tie_word_embeddings": text.get("tie_word_embeddings", config.get("tie_word_embeddings", False))}
    config = {**_DEFAULTS, **config}
    num_layers = config["num_hidden_layers"]
    config["no_rope_layers"] = [int(flag) for flag in _rope_flags(config, num_layers)]
    if not config.get("layer_types"):
        chunked = config["attention_chunk_size"] is not None
        config["layer_types"] = ["chunked_attention" if rope and chunked else "full_attention"
                                 for rope in config["no_rope_layers"]]
    if config.get("moe_layers") is None:
        step = int(config["interleave_moe_layer_step"])
        if step < 1:
            raise ValueError(f"Llama 4 interleave_moe_layer_step must be >= 1, got {step}")
        config["moe_layers"] = list(range(step - 1, num_layers, step))
    return config


def _rope_flags(config: dict[str, Any], num_layers: int) -> list[bool]:
    flags = config.get("no_rope_layers")
    if not flags:
        interval = int(config["no_rope_layer_interval"])
        return [(index + 1) % interval != 0 for index in range(num_layers)]
    if len(flags) < num_layers:
        raise ValueError(f"no_rope_layers has {len(flags)} entries for {num_layers} layers")
    return [bool(flag) for flag in flags[:num_layers]]


def llama4_config(config: dict[str, Any], max_positions: int) -> Llama4Config:
    """Llama4Config from either architecture's config.json; ValueError for what this module does not serve."""
    text = text_config(config)
    _check(text, config)
    num_layers, num_experts = text["num_hidden_layers"], int(text["num_local_experts"])
    moe = set(text["moe_layers"])
    base = replace(llama.decoder_config(text, max_positions), mlp_bias=False, num_experts=num_experts,
                   num_experts_per_tok=int(text["num_experts_per_tok"]))
    shared = {field.name: getattr(base, field.name) for field in fields(base)}
    return Llama4Config(**shared, dense_intermediate_size=int(text["intermediate_size_mlp"]),
                        rope_layers=tuple(bool(flag) for flag in text["no_rope_layers"]),
                        moe_layers=tuple(index in moe for index in range(num_layers)),
                        l2_qk_norm=bool(text["use_qk_norm"]), temperature_tuning=bool(text["attn_temperature_tuning"]),
                        floor_scale=float(text["floor_scale"]), attn_scale=float(text["attn_scale"]))


def _check(text: dict[str, Any], config: dict[str, Any]) -> None:
    if text["hidden_act"] != "silu":
        raise ValueError(f"Llama 4 hidden_act must be 'silu', got {text['hidden_act']!r}")
    if int(text["num_local_experts"]) < 1:
        raise ValueError(f"Llama 4 num_local_experts must be >= 1, got {text['num_local_experts']}")
    for source in (config, text):
        if source.get("quantization_config"):
            method = source["quantization_config"].get("quant_method")
            raise ValueError(f"Llama 4 checkpoints with a quantization_config (quant_method {method!r}) are not "
                             "supported: use an unquantized (bfloat16) checkpoint")
