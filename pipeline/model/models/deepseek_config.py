"""DeepSeek-V2/V3 settings from config.json (deepseek.py serves the models), checked where HF's
modeling code would compute something else than the config says.

- HF makes every layer from first_k_dense_replace on sparse and ignores moe_layer_freq, so another
  value than 1 is refused rather than guessed;
- V2's router scores by softmax and picks greedy or group_limited_greedy, never renormalising (HF's
  router ignores norm_topk_prob, so true is refused); V3's scores by sigmoid and picks noaux_tc
  (HF's router ignores topk_method and scoring_func, so other values are refused);
- the softmax scale is qk_head_dim ** -0.5, times mscale ** 2 with mscale = 0.1 * mscale_all_dim *
  ln(factor) + 1 when the rope is scaled (YaRN) and sets mscale_all_dim (HF's yarn_apply_mscale).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

from pipeline.model.layers.grouped_moe import GroupedRouting
from pipeline.model.models import llama
from pipeline.model.models.llama import DecoderConfig

_V3 = "DeepseekV3ForCausalLM"


@dataclass(frozen=True, slots=True)
class DeepseekConfig(DecoderConfig):
    """Llama's settings (num_experts and num_experts_per_tok from the routing) plus MLA's and the MoE plan."""

    # head_dim (DecoderConfig) is qk_rope_head_dim: the width of the rotary table.
    q_lora_rank: int | None = None
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    rope_interleave: bool = True
    attention_bias: bool = False
    scale: float = 1.0
    moe_intermediate_size: int = 0
    n_shared_experts: int = 0
    first_k_dense_replace: int = 0
    routing: GroupedRouting | None = None  # None: every layer dense


def deepseek_config(config: dict[str, Any], max_positions: int) -> DeepseekConfig:
    v3 = config["architectures"][0] == _V3
    family = "DeepSeek-V3" if v3 else "DeepSeek-V2"
    _check(config, family)
    base = llama.decoder_config({**config, "head_dim": config["qk_rope_head_dim"]}, max_positions)
    shared = {field.name: getattr(base, field.name) for field in fields(base)}
    routing = _routing(config, v3, family)
    shared.update(qkv_bias=False, o_bias=False, qk_norm=False, mlp_bias=False if v3 else bool(config.get("mlp_bias")),
                  num_kv_heads=base.num_heads, layer_windows=(), num_experts=routing.num_experts if routing else 0,
                  num_experts_per_tok=routing.top_k if routing else 0)
    qk_head_dim = config["qk_nope_head_dim"] + config["qk_rope_head_dim"]
    return DeepseekConfig(
        **shared, q_lora_rank=config.get("q_lora_rank"), kv_lora_rank=int(config["kv_lora_rank"]),
        qk_nope_head_dim=int(config["qk_nope_head_dim"]), qk_rope_head_dim=int(config["qk_rope_head_dim"]),
        v_head_dim=int(config["v_head_dim"]), rope_interleave=bool(config.get("rope_interleave", True)) if v3 else True,
        attention_bias=bool(config.get("attention_bias", False)), scale=softmax_scale(config, qk_head_dim),
        moe_intermediate_size=int(config.get("moe_intermediate_size") or 0),
        n_shared_experts=int(config.get("n_shared_experts") or 0),
        first_k_dense_replace=int(config.get("first_k_dense_replace") or 0), routing=routing)


def _check(config: dict[str, Any], family: str) -> None:
    if config.get("hidden_act", "silu") != "silu":
        raise ValueError(f"{family} hidden_act must be 'silu', got {config['hidden_act']!r}")
    if int(config.get("moe_layer_freq", 1)) != 1:
        raise ValueError(f"{family} moe_layer_freq must be 1 (HF makes every layer from first_k_dense_replace on "
                         f"sparse), got {config['moe_layer_freq']}")


def _routing(config: dict[str, Any], v3: bool, family: str) -> GroupedRouting | None:
    num_experts = int(config.get("n_routed_experts") or 0)
    if not num_experts:
        return None
    method = config.get("topk_method") or ("noaux_tc" if v3 else "greedy")
    scoring = config.get("scoring_func") or ("sigmoid" if v3 else "softmax")
    allowed = ("noaux_tc",) if v3 else ("greedy", "group_limited_greedy")
    if method not in allowed:
        raise ValueError(f"{family} topk_method must be one of {allowed} (what HF's router computes), got {method!r}")
    if scoring != ("sigmoid" if v3 else "softmax"):
        raise ValueError(f"{family} scoring_func must be {'sigmoid' if v3 else 'softmax'!r}, got {scoring!r}")
    norm = bool(config.get("norm_topk_prob", v3))
    if norm and not v3:
        raise ValueError("DeepSeek-V2 norm_topk_prob must be false: HF's DeepseekV2 router never renormalises")
    # Absent keys take HF's config defaults (V3: 8 groups, 4 kept, scaling 2.5; V2: none, 1.0).
    return GroupedRouting(num_experts=num_experts, top_k=int(config["num_experts_per_tok"]), topk_method=method,
                          scoring_func=scoring, num_groups=int(config.get("n_group", 8 if v3 else None) or 1),
                          topk_group=int(config.get("topk_group", 4 if v3 else None) or 1), norm_topk_prob=norm,
                          routed_scaling_factor=float(config.get("routed_scaling_factor", 2.5 if v3 else 1.0)))


def softmax_scale(config: dict[str, Any], qk_head_dim: int) -> float:
    """qk_head_dim ** -0.5, times YaRN's mscale ** 2 where a scaled rope sets mscale_all_dim (HF's rule)."""
    scale = qk_head_dim**-0.5
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    mscale_all_dim = rope.get("mscale_all_dim") or 0
    factor = float(rope.get("factor") or 1.0)
    if rope.get("rope_type", rope.get("type", "default")) != "default" and mscale_all_dim and factor > 1:
        mscale = 0.1 * mscale_all_dim * math.log(factor) + 1.0
        scale *= mscale * mscale
    return scale
