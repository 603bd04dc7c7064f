"""Read and validate a PEFT LoRA directory: adapter_config.json + adapter_model.safetensors.

What we serve: plain LoRA (`y = W x + scale * B (A x)`) on the attention and MLP projections
q/k/v/o/gate/up/down_proj of every decoder layer, any rank up to the configured maximum, with
scale = lora_alpha / r, or lora_alpha / sqrt(r) under use_rslora. Anything else an adapter asks
for (DoRA, modules_to_save, LoRA on embeddings or lm_head, per-module rank/alpha patterns, LoRA
biases, a target the model lacks, shapes that do not fit the model) is a LoRAError when loading,
so it can never silently give a different answer than PEFT would.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
# base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight -> (3, q_proj, A)
_KEY = re.compile(r"^base_model\.model\.model\.layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)\.lora_([AB])\.weight$")


class LoRAError(ValueError):
    """An adapter that cannot be served; the message names the adapter and the problem."""


@dataclass(frozen=True, slots=True)
class ModelShapes:
    """What an adapter must fit: layer count and (in, out) features of each target module."""

    num_layers: int
    features: dict[str, tuple[int, int]]  # target module name -> (in_features, out_features)


@dataclass(slots=True)
class LoRAAdapter:
    """One adapter's weights in host memory (float32), keyed by (layer, module).

    a: [in_features, rank] and b: [rank, out_features], i.e. PEFT's lora_A.weight / lora_B.weight
    transposed, so the delta of token rows x is (x @ a) @ b * scale.
    """

    name: str
    rank: int
    scale: float
    weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]

    @property
    def target_modules(self) -> frozenset[str]:
        return frozenset(module for _, module in self.weights)


def read_adapter(name: str, path: str | Path, shapes: ModelShapes, max_rank: int) -> LoRAAdapter:
    """Load and check the PEFT adapter in directory `path`; LoRAError says what does not fit."""
    path = Path(path)
    config = _read_config(name, path)
    rank, scale = _rank_and_scale(name, config, max_rank)
    weights = _read_weights(name, path, rank)
    _check_shapes(name, weights, shapes)
    return LoRAAdapter(name=name, rank=rank, scale=scale, weights=weights)


def _read_config(name: str, path: Path) -> dict[str, Any]:
    config_path = path / CONFIG_FILE
    if not config_path.is_file():
        raise LoRAError(f"lora adapter {name!r}: no {CONFIG_FILE} in {path}")
    if not (path / WEIGHTS_FILE).is_file():
        raise LoRAError(f"lora adapter {name!r}: no {WEIGHTS_FILE} in {path} (only safetensors adapters are read)")
    try:
        config = json.loads(config_path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise LoRAError(f"lora adapter {name!r}: cannot read {config_path}: {error}") from error
    if not isinstance(config, dict):
        raise LoRAError(f"lora adapter {name!r}: {CONFIG_FILE} must hold a JSON object")
    return config


def _rank_and_scale(name: str, config: dict[str, Any], max_rank: int) -> tuple[int, float]:
    peft_type = config.get("peft_type", "LORA")
    unsupported = [
        (peft_type != "LORA", f"peft_type must be LORA, got {peft_type!r}"),
        (bool(config.get("use_dora")), "use_dora (DoRA) is not supported"),
        (bool(config.get("modules_to_save")), f"modules_to_save is not supported, got {config.get('modules_to_save')}"),
        (bool(config.get("rank_pattern")), "rank_pattern (per-module ranks) is not supported"),
        (bool(config.get("alpha_pattern")), "alpha_pattern (per-module alphas) is not supported"),
        (config.get("bias", "none") != "none", f"bias must be 'none', got {config.get('bias')!r}"),
        (bool(config.get("lora_bias")), "lora_bias is not supported"),
        (bool(config.get("fan_in_fan_out")), "fan_in_fan_out is not supported"),
    ]
    for failed, message in unsupported:
        if failed:
            raise LoRAError(f"lora adapter {name!r}: {message}")
    rank, alpha = config.get("r"), config.get("lora_alpha")
    if not isinstance(rank, int) or rank < 1:
        raise LoRAError(f"lora adapter {name!r}: r must be an int >= 1, got {rank!r}")
    if rank > max_rank:
        raise LoRAError(f"lora adapter {name!r}: rank {rank} exceeds --max-lora-rank {max_rank}")
    if not isinstance(alpha, int | float):
        raise LoRAError(f"lora adapter {name!r}: lora_alpha must be a number, got {alpha!r}")
    scale = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
    return rank, float(scale)


def _read_weights(name: str, path: Path, rank: int) -> dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]:
    halves: dict[tuple[int, str, str], torch.Tensor] = {}
    with safe_open(str(path / WEIGHTS_FILE), framework="pt") as file:
        for key in file.keys():  # noqa: SIM118 (safe_open is not a mapping)
            match = _KEY.match(key)
            if match is None:
                raise LoRAError(f"lora adapter {name!r}: unsupported tensor {key!r} ({_explain(key)})")
            layer, module, half = int(match.group(1)), match.group(2), match.group(3)
            if module not in TARGET_MODULES:
                raise LoRAError(f"lora adapter {name!r}: target module {module!r} is not supported "
                                f"(supported: {', '.join(TARGET_MODULES)})")
            halves[(layer, module, half)] = file.get_tensor(key).float()
    weights = {}
    for layer, module, half in halves:
        if half != "A":
            continue
        lora_a, lora_b = halves[(layer, module, "A")], halves.get((layer, module, "B"))
        if lora_b is None:
            raise LoRAError(f"lora adapter {name!r}: layer {layer} {module} has lora_A but no lora_B")
        if lora_a.ndim != 2 or lora_b.ndim != 2 or lora_a.shape[0] != rank or lora_b.shape[1] != rank:
            raise LoRAError(f"lora adapter {name!r}: layer {layer} {module} has lora_A {tuple(lora_a.shape)} and "
                            f"lora_B {tuple(lora_b.shape)}, expected [{rank}, in] and [out, {rank}] (r={rank})")
        weights[(layer, module)] = (lora_a.t().contiguous(), lora_b.t().contiguous())
    if len(weights) * 2 != len(halves):
        raise LoRAError(f"lora adapter {name!r}: some lora_B tensors have no lora_A")
    if not weights:
        raise LoRAError(f"lora adapter {name!r}: {WEIGHTS_FILE} holds no LoRA weights")
    return weights


def _explain(key: str) -> str:
    if "lora_magnitude_vector" in key:
        return "DoRA is not supported"
    if "embed" in key or "lm_head" in key:
        return "LoRA on embeddings or lm_head is not supported"
    if key.endswith(".bias"):
        return "LoRA biases are not supported"
    return "only lora_A/lora_B weights of the decoder layers' projections are supported"


def _check_shapes(name: str, weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]],
                  shapes: ModelShapes) -> None:
    for (layer, module), (lora_a, lora_b) in weights.items():
        if layer >= shapes.num_layers:
            raise LoRAError(f"lora adapter {name!r}: layer {layer} does not exist (the model has "
                            f"{shapes.num_layers} layers)")
        if module not in shapes.features:
            raise LoRAError(f"lora adapter {name!r}: the model has no {module!r} to adapt")
        in_features, out_features = shapes.features[module]
        if lora_a.shape[0] != in_features or lora_b.shape[1] != out_features:
            raise LoRAError(f"lora adapter {name!r}: layer {layer} {module} maps {lora_a.shape[0]} -> "
                            f"{lora_b.shape[1]} features, the base model's {in_features} -> {out_features} "
                            "(an adapter for another base model?)")
