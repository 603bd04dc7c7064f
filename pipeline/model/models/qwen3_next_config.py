"""Qwen3-Next's and Qwen3.5's settings from config.json, as transformers' Qwen3NextConfig, Qwen3_5TextConfig
and Qwen3_5MoeTextConfig read them (qwen3_next.py serves them).

- A `...ForConditionalGeneration` config's language model is its `text_config` (its top-level
  `tie_word_embeddings` governs); keys a config leaves out take the transformers class's defaults.
- Layer kinds: `layer_types` (`linear_attention` or `full_attention`) when given, else every
  `full_attention_interval`-th layer (default 4) attends fully: [linear, linear, linear, full, ...].
- Rope: `rope_parameters` (or the older `rope_theta` + `rope_scaling`) over the first
  `partial_rotary_factor` (default 0.25) of each head; Qwen3.5's multimodal rope sections
  (`mrope_section`) rotate every section by the same position for text, which is plain rope.
- MLPs: Qwen3-Next routes on layer i when i is not in `mlp_only_layers`, num_experts > 0 and
  (i + 1) % decoder_sparse_step == 0, renormalising the top-k weights when `norm_topk_prob` (default
  True); Qwen3.5-MoE routes on every layer and always renormalises; Qwen3.5 is dense. Routed layers add
  a shared expert of `shared_expert_intermediate_size` behind a sigmoid gate; dense ones are a SwiGLU
  MLP of `intermediate_size`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pipeline.model.layers.rope import RopeParams, parse_rope

NEXT, DENSE, MOE = "Qwen3NextForCausalLM", "Qwen3_5ForCausalLM", "Qwen3_5MoeForCausalLM"
# A multimodal checkpoint served text only -> the language model it holds.
MULTIMODAL = {"Qwen3_5ForConditionalGeneration": DENSE, "Qwen3_5MoeForConditionalGeneration": MOE}

# Qwen3NextConfig's defaults for keys a config.json may leave out, and what the Qwen3.5 classes change.
_DEFAULTS: dict[str, Any] = {
    "vocab_size": 151_936, "hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 48,
    "num_attention_heads": 16, "num_key_value_heads": 2, "hidden_act": "silu", "max_position_embeddings": 32_768,
    "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "attention_bias": False, "head_dim": 256,
    "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
    "linear_num_key_heads": 16, "linear_num_value_heads": 32, "decoder_sparse_step": 1,
    "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512, "num_experts_per_tok": 10,
    "num_experts": 512, "norm_topk_prob": True, "mlp_only_layers": [], "full_attention_interval": 4,
    "rope_theta": 10_000.0,
}
_OVERRIDES: dict[str, dict[str, Any]] = {
    DENSE: {"vocab_size": 248_320, "hidden_size": 4096, "intermediate_size": 12_288, "num_hidden_layers": 32,
            "num_key_value_heads": 4},
    MOE: {"vocab_size": 248_320, "hidden_size": 2048, "num_hidden_layers": 40, "num_experts_per_tok": 8,
          "num_experts": 256},
}


@dataclass(frozen=True, slots=True)
class HybridConfig:
    architecture: str  # the language model's: NEXT, DENSE or MOE
    vocab_size: int
    hidden_size: int
    num_layers: int
    linear_layers: tuple[bool, ...]  # per layer: gated DeltaNet (True) or gated full attention
    rms_norm_eps: float
    tie_word_embeddings: bool
    max_positions: int  # rows of the rotary table
    # full attention
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rotary_dim: int  # leading dims of each head that rotate
    rope: RopeParams
    attention_bias: bool
    # gated DeltaNet
    linear_num_key_heads: int
    linear_num_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    conv_kernel: int
    # MLPs
    intermediate_size: int
    sparse_layers: tuple[bool, ...]  # per layer: routed experts and a shared expert (True) or a dense MLP
    num_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    shared_expert_intermediate_size: int
    norm_topk_prob: bool

    @property
    def num_attention_layers(self) -> int:
        return self.linear_layers.count(False)

    @property
    def num_linear_layers(self) -> int:
        return self.linear_layers.count(True)


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The language model's config.json with the transformers class's defaults filled in and its
    `architectures` naming the language model (Qwen3_5ForCausalLM for Qwen3_5ForConditionalGeneration)."""
    architecture = config["architectures"][0]
    if architecture in MULTIMODAL:
        text = config.get("text_config") or {}
        config = {**text, "architectures": [MULTIMODAL[architecture]],
                  "tie_word_embeddings": config.get("tie_word_embeddings", text.get("tie_word_embeddings", False))}
        architecture = MULTIMODAL[architecture]
    config = {**_DEFAULTS, **_OVERRIDES.get(architecture, {}), **config}
    if not config.get("layer_types"):
        interval = int(config["full_attention_interval"])
        config["layer_types"] = ["full_attention" if (index + 1) % interval == 0 else "linear_attention"
                                 for index in range(config["num_hidden_layers"])]
    return config


def hybrid_config(config: dict[str, Any], max_positions: int) -> HybridConfig:
    """HybridConfig from any of the served architectures' config.json; ValueError for what is not served."""
    text = text_config(config)
    architecture = text["architectures"][0]
    num_layers = int(text["num_hidden_layers"])
    kinds = list(text["layer_types"])
    if len(kinds) != num_layers:
        raise ValueError(f"layer_types has {len(kinds)} entries for {num_layers} layers")
    unknown = sorted(set(kinds) - {"linear_attention", "full_attention"})
    if unknown:
        raise ValueError(f"layer types {unknown} are not supported (linear_attention and full_attention are)")
    if "full_attention" not in kinds:  # the KV cache is sized by its attention layers
        raise ValueError(f"{architecture} needs at least one full_attention layer, got layer_types {kinds}")
    if text["hidden_act"] != "silu":
        raise ValueError(f"{architecture} hidden_act must be 'silu', got {text['hidden_act']!r}")
    rope_params = dict(text.get("rope_parameters") or text.get("rope_scaling") or {})
    head_dim = int(text.get("head_dim") or text["hidden_size"] // text["num_attention_heads"])
    partial = rope_params.get("partial_rotary_factor", text.get("partial_rotary_factor", 0.25))
    rotary_dim = int(head_dim * float(partial))
    if rotary_dim < 2 or rotary_dim % 2:
        raise ValueError(f"the rotary part of a head must be an even number of dims >= 2, got {rotary_dim}")
    num_experts = 0 if architecture == DENSE else int(text["num_experts"] or 0)
    return HybridConfig(
        architecture=architecture, vocab_size=int(text["vocab_size"]), hidden_size=int(text["hidden_size"]),
        num_layers=num_layers, linear_layers=tuple(kind == "linear_attention" for kind in kinds),
        rms_norm_eps=float(text["rms_norm_eps"]), tie_word_embeddings=bool(text["tie_word_embeddings"]),
        max_positions=max_positions, num_heads=int(text["num_attention_heads"]),
        num_kv_heads=int(text["num_key_value_heads"] or text["num_attention_heads"]), head_dim=head_dim,
        rotary_dim=rotary_dim, rope=parse_rope(text), attention_bias=bool(text["attention_bias"]),
        linear_num_key_heads=int(text["linear_num_key_heads"]),
        linear_num_value_heads=int(text["linear_num_value_heads"]),
        linear_key_head_dim=int(text["linear_key_head_dim"]), linear_value_head_dim=int(text["linear_value_head_dim"]),
        conv_kernel=int(text["linear_conv_kernel_dim"]), intermediate_size=int(text["intermediate_size"]),
        sparse_layers=_sparse_layers(text, architecture, num_layers, num_experts), num_experts=num_experts,
        num_experts_per_tok=int(text["num_experts_per_tok"]) if num_experts else 0,
        moe_intermediate_size=int(text["moe_intermediate_size"]),
        shared_expert_intermediate_size=int(text["shared_expert_intermediate_size"]),
        norm_topk_prob=True if architecture == MOE else bool(text["norm_topk_prob"]))


def _sparse_layers(text: dict[str, Any], architecture: str, num_layers: int, num_experts: int) -> tuple[bool, ...]:
    if architecture == MOE:
        if num_experts < 1:
            raise ValueError(f"{MOE} num_experts must be >= 1, got {num_experts}")
        return (True,) * num_layers
    step = int(text["decoder_sparse_step"])
    if step < 1:
        raise ValueError(f"{architecture} decoder_sparse_step must be >= 1, got {step}")
    mlp_only = set(text.get("mlp_only_layers") or ())
    return tuple(index not in mlp_only and num_experts > 0 and (index + 1) % step == 0 for index in range(num_layers))
