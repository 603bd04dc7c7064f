"""Gemma 4 text settings from config.json, as Gemma4TextConfig reads them: the layer kinds, each
layer's head size and KV heads (global layers are wider: `per_layer_config`, or `global_head_dim`
and `num_global_key_value_heads` in older configs), which layers reuse an earlier layer's keys and
values (`num_kv_shared_layers`), and the two ropes (default on sliding layers, proportional on
global ones: the first `partial_rotary_factor` of each head's frequency pairs turn, the rest stay).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

_GELU_TANH = "gelu_pytorch_tanh"
_SLIDING_WINDOW_PATTERN = 6

# Gemma4TextConfig's defaults for keys a config.json may leave out.
_DEFAULTS: dict[str, Any] = {
    "vocab_size": 262_144, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 30,
    "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "hidden_activation": _GELU_TANH,
    "max_position_embeddings": 131_072, "rms_norm_eps": 1e-6, "tie_word_embeddings": True, "attention_bias": False,
    "sliding_window": 512, "final_logit_softcapping": None, "vocab_size_per_layer_input": 262_144,
    "hidden_size_per_layer_input": 256, "attention_k_eq_v": False, "num_kv_shared_layers": 0,
    "enable_moe_block": False, "use_double_wide_mlp": False, "pad_token_id": 0,
}
_DEFAULT_ROPE: dict[str, dict[str, Any]] = {
    "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
    "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0},
}


@dataclass(frozen=True, slots=True)
class LayerSpec:
    window: int | None  # None: a global (full attention) layer
    head_dim: int
    num_kv_heads: int
    intermediate_size: int
    kv_source: int | None = None  # the earlier layer whose keys and values this one reuses
    k_eq_v: bool = False  # no v_proj: the values are the keys' projection (global layers, attention_k_eq_v)


@dataclass(frozen=True, slots=True)
class RotarySpec:
    theta: float
    rotary_fraction: float = 1.0  # of each head's frequency pairs that turn (proportional rope)


@dataclass(frozen=True, slots=True)
class Gemma4Config:
    vocab_size: int
    hidden_size: int
    num_heads: int
    rms_norm_eps: float
    max_positions: int
    tie_word_embeddings: bool
    attention_bias: bool
    final_logit_softcap: float | None
    per_layer_size: int  # per-layer input embeddings' width per layer (0: none)
    per_layer_vocab_size: int
    layers: tuple[LayerSpec, ...]
    local_rope: RotarySpec
    global_rope: RotarySpec

    @property
    def cache_head_dim(self) -> int:
        """One KV cache shape serves every layer: the widest head; narrower ones are zero-padded."""
        return max(layer.head_dim for layer in self.layers)

    @property
    def cache_kv_heads(self) -> int:
        """The most KV heads of any layer; a layer with fewer repeats each head (as GQA reads them)."""
        return max(layer.num_kv_heads for layer in self.layers)


def with_defaults(config: dict[str, Any]) -> dict[str, Any]:
    """config.json with Gemma4TextConfig's defaults for the keys it leaves out."""
    return {**_DEFAULTS, **config}


def gemma4_config(config: dict[str, Any], max_positions: int) -> Gemma4Config:
    """Gemma4Config from a Gemma4ForCausalLM config.json; ValueError for what this module does not serve."""
    config = with_defaults(config)
    _check_served(config)
    kinds = _layer_types(config)
    ropes = {**_DEFAULT_ROPE, **(config.get("rope_parameters") or {})}
    return Gemma4Config(
        vocab_size=config["vocab_size"], hidden_size=config["hidden_size"], num_heads=config["num_attention_heads"],
        rms_norm_eps=float(config["rms_norm_eps"]), max_positions=max_positions,
        tie_word_embeddings=bool(config["tie_word_embeddings"]), attention_bias=bool(config["attention_bias"]),
        final_logit_softcap=_optional_float(config["final_logit_softcapping"]),
        per_layer_size=int(config["hidden_size_per_layer_input"] or 0),
        per_layer_vocab_size=int(config["vocab_size_per_layer_input"]),
        layers=_layer_specs(config, kinds), local_rope=_rotary(ropes["sliding_attention"], "default"),
        global_rope=_rotary(ropes["full_attention"], "proportional"))


def _check_served(config: dict[str, Any]) -> None:
    if config["hidden_activation"] != _GELU_TANH:
        raise ValueError(f"Gemma 4 hidden_activation must be {_GELU_TANH!r}, got {config['hidden_activation']!r}")
    if config.get("use_bidirectional_attention"):
        raise ValueError("use_bidirectional_attention must be unset: only causal Gemma 4 is served")
    if config["enable_moe_block"]:
        raise ValueError("Gemma 4 with enable_moe_block (the 26B-A4B experts) is not supported yet")


def _layer_types(config: dict[str, Any]) -> list[str]:
    kinds = list(config.get("layer_types") or [
        "sliding_attention" if (index + 1) % _SLIDING_WINDOW_PATTERN else "full_attention"
        for index in range(config["num_hidden_layers"])])
    if len(kinds) != config["num_hidden_layers"]:
        raise ValueError(f"layer_types has {len(kinds)} entries for {config['num_hidden_layers']} layers")
    unknown = set(kinds) - {"full_attention", "sliding_attention"}
    if unknown:
        raise ValueError(f"layer types {sorted(unknown)} are not supported")
    kinds[-1] = "full_attention"  # Gemma4TextConfig forces it
    return kinds


def _layer_specs(config: dict[str, Any], kinds: list[str]) -> tuple[LayerSpec, ...]:
    sources = kv_sources(kinds, int(config["num_kv_shared_layers"]))
    specs = []
    for index, kind in enumerate(kinds):
        is_global = kind == "full_attention"
        head_dim, kv_heads = _layer_head_shape(config, index, is_global)
        wide = config["use_double_wide_mlp"] and sources[index] is not None
        intermediate = config["intermediate_size"] * (2 if wide else 1)
        specs.append(LayerSpec(window=None if is_global else int(config["sliding_window"]), head_dim=head_dim,
                               num_kv_heads=kv_heads, intermediate_size=intermediate,
                               kv_source=sources[index], k_eq_v=bool(config["attention_k_eq_v"]) and is_global))
    _check_shapes(specs, int(config["num_attention_heads"]))
    return tuple(specs)


def _check_shapes(specs: list[LayerSpec], num_heads: int) -> None:
    """One rope table per layer kind needs one head size per kind; the shared cache layout needs
    every layer's KV heads to divide the most any layer has."""
    for is_global in (True, False):
        sizes = {spec.head_dim for spec in specs if (spec.window is None) == is_global}
        if len(sizes) > 1:
            raise ValueError(f"Gemma 4 layers of one kind must share a head_dim, got {sorted(sizes)}")
    most = max(spec.num_kv_heads for spec in specs)
    if any(most % spec.num_kv_heads for spec in specs) or num_heads % most:
        raise ValueError(f"Gemma 4 KV heads per layer {sorted({spec.num_kv_heads for spec in specs})} must divide "
                         f"{most}, and {most} must divide num_attention_heads ({num_heads})")


def _layer_head_shape(config: dict[str, Any], index: int, is_global: bool) -> tuple[int, int]:
    """(head_dim, KV heads) of one layer: `per_layer_config` (transformers 5) overrides, else the
    global layers' `global_head_dim` (512 by default) and, with attention_k_eq_v, `num_global_key_value_heads`."""
    head_dim, kv_heads = int(config["head_dim"]), int(config["num_key_value_heads"])
    per_layer = config.get("per_layer_config")
    if per_layer is not None:
        override = per_layer.get(str(index)) or per_layer.get(index) or {}
        return int(override.get("head_dim", head_dim)), int(override.get("num_key_value_heads", kv_heads))
    if not is_global:
        return head_dim, kv_heads
    global_kv = config.get("num_global_key_value_heads") if config["attention_k_eq_v"] else None
    return int(config.get("global_head_dim") or 512), int(global_kv or kv_heads)


def kv_sources(kinds: list[str], num_shared: int) -> list[int | None]:
    """Per layer, the earlier layer whose keys and values it reuses (None: its own), as HF's
    kv_sharing_modes: the last `num_shared` layers reuse the last earlier layer of their kind.

    ["sliding", "full", "sliding", "full"] with 2 shared -> [None, None, 0, 1]
    """
    first_shared = len(kinds) - num_shared
    owners = kinds[:first_shared]
    if num_shared and set(owners) != set(kinds):
        raise ValueError("num_kv_shared_layers leaves a layer kind with no earlier layer to share keys and values from")
    last_of = {kind: max(index for index, owner in enumerate(owners) if owner == kind) for kind in set(owners)}
    return [None if index < first_shared else last_of[kind] for index, kind in enumerate(kinds)]


def _rotary(params: dict[str, Any], expected: str) -> RotarySpec:
    rope_type = params.get("rope_type", "default")
    if rope_type != expected:
        raise ValueError(f"Gemma 4 rope type {rope_type!r} is not supported here (expected {expected!r})")
    if float(params.get("factor", 1.0)) != 1.0:
        raise ValueError(f"Gemma 4 rope factor {params['factor']} is not supported (only 1.0)")
    fraction = float(params.get("partial_rotary_factor", 1.0))
    return RotarySpec(theta=float(params["rope_theta"]), rotary_fraction=fraction)


def _optional_float(value: Any) -> float | None:
    return None if value is None else float(value)
