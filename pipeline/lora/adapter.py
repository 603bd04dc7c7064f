"""Read and validate a PEFT LoRA directory: adapter_config.json + adapter_model.safetensors.

What we serve: plain LoRA (`y = W x + scale * B (A x)`) on the attention and MLP projections
q/k/v/o/gate/up/down_proj of every decoder layer, any rank up to the configured maximum, with
scale = lora_alpha / r, or lora_alpha / sqrt(r) under use_rslora. Anything else an adapter asks
for (DoRA, modules_to_save, LoRA on embeddings or lm_head, per-module rank/alpha patterns, LoRA
biases, a target the model lacks, shapes that do not fit the model) is a LoRAError when loading,
so it can never silently give a different answer than PEFT would.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from pipeline.request.untrusted import UntrustedValueError, loads_json

TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
CONFIG_FILE = "adapter_config.json"
MAX_CONFIG_BYTES = 1 << 20  # a PEFT config is a few hundred bytes
WEIGHTS_FILE = "adapter_model.safetensors"
# base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight -> (3, q_proj, A)
_FLOAT_DTYPES = ("F16", "BF16", "F32", "F64")
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


def read_adapter(name: str, path: str | Path, shapes: ModelShapes, max_rank: int,
                 root: Path | None = None) -> LoRAAdapter:
    """Load and check the PEFT adapter in directory `path`; LoRAError says what does not fit.

    The files are not trusted (a control entry names any path): each is read through its real path,
    which must lie under `root` (--lora-root, already resolved) when one is given; the config is read
    as untrusted JSON of bounded size, and the safetensors header (names, shapes, dtypes) is checked
    against the model before any tensor is read."""
    directory = _real_path(name, Path(path), root)
    config = _read_config(name, directory, root)
    rank, scale = _rank_and_scale(name, config, max_rank)
    weights = _read_weights(name, _real_path(name, directory / WEIGHTS_FILE, root), rank, shapes)
    return LoRAAdapter(name=name, rank=rank, scale=scale, weights=weights)


def _real_path(name: str, path: Path, root: Path | None) -> Path:
    """`path` with every symlink resolved, refused unless under `root`: the files are opened by this
    checked path, so a link re-pointed after the check is never followed."""
    try:
        real = path.resolve(strict=True)
    except (OSError, RuntimeError, ValueError) as error:  # missing, a symlink loop, a NUL in the path
        raise LoRAError(f"lora adapter {name!r}: {path} cannot be resolved: {error}") from error
    if root is not None and not real.is_relative_to(root):
        raise LoRAError(f"lora adapter {name!r}: {path} is outside --lora-root {str(root)!r}")
    return real


def _read_config(name: str, directory: Path, root: Path | None) -> dict[str, Any]:
    if not (directory / CONFIG_FILE).is_file():
        raise LoRAError(f"lora adapter {name!r}: no {CONFIG_FILE} in {directory}")
    if not (directory / WEIGHTS_FILE).is_file():
        raise LoRAError(f"lora adapter {name!r}: no {WEIGHTS_FILE} in {directory} (only safetensors adapters are read)")
    config_path = _real_path(name, directory / CONFIG_FILE, root)
    try:
        if config_path.stat().st_size > MAX_CONFIG_BYTES:
            raise LoRAError(f"lora adapter {name!r}: {CONFIG_FILE} is larger than {MAX_CONFIG_BYTES} bytes")
        config = loads_json(config_path.read_bytes(), CONFIG_FILE)
    except (OSError, UntrustedValueError) as error:
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


def _read_weights(name: str, weights_path: Path, rank: int,
                  shapes: ModelShapes) -> dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]:
    try:
        with safe_open(str(weights_path), framework="pt") as file:
            layout = _check_layout(name, {key: file.get_slice(key) for key in file.keys()}, rank,  # noqa: SIM118
                                   shapes)
            halves = {place: file.get_tensor(key).float() for key, place in layout.items()}
    except LoRAError:
        raise
    except Exception as error:  # safetensors' own errors (a bad header, offsets past the end) and I/O
        raise LoRAError(f"lora adapter {name!r}: cannot read {WEIGHTS_FILE}: {type(error).__name__}: "
                        f"{error}") from error
    return {(layer, module): (halves[(layer, module, "A")].t().contiguous(),
                              halves[(layer, module, "B")].t().contiguous())
            for layer, module, half in halves if half == "A"}


def _check_layout(name: str, slices: dict[str, Any], rank: int, shapes: ModelShapes) -> dict[str, tuple[int, str, str]]:
    """Tensor name -> (layer, module, A or B), after checking every name, dtype and shape in the
    header: lora_A [rank, in_features] and lora_B [out_features, rank] of a module the model has."""
    layout: dict[str, tuple[int, str, str]] = {}
    for key, tensor in slices.items():
        match = _KEY.match(key)
        if match is None:
            raise LoRAError(f"lora adapter {name!r}: unsupported tensor {key!r} ({_explain(key)})")
        layer, module, half = int(match.group(1)), match.group(2), match.group(3)
        if module not in TARGET_MODULES:
            raise LoRAError(f"lora adapter {name!r}: target module {module!r} is not supported "
                            f"(supported: {', '.join(TARGET_MODULES)})")
        if tensor.get_dtype() not in _FLOAT_DTYPES:
            raise LoRAError(f"lora adapter {name!r}: {key} is {tensor.get_dtype()}, not a float type")
        _check_shape(name, layer, module, half, list(tensor.get_shape()), rank, shapes)
        layout[key] = (layer, module, half)
    places = set(layout.values())
    unpaired = sorted(f"layer {layer} {module}" for layer, module, half in places
                      if (layer, module, "B" if half == "A" else "A") not in places)
    if unpaired:
        raise LoRAError(f"lora adapter {name!r}: {unpaired[0]} has only one of lora_A and lora_B")
    if not places:
        raise LoRAError(f"lora adapter {name!r}: {WEIGHTS_FILE} holds no LoRA weights")
    return layout


def _explain(key: str) -> str:
    if "lora_magnitude_vector" in key:
        return "DoRA is not supported"
    if "embed" in key or "lm_head" in key:
        return "LoRA on embeddings or lm_head is not supported"
    if key.endswith(".bias"):
        return "LoRA biases are not supported"
    return "only lora_A/lora_B weights of the decoder layers' projections are supported"


def _check_shape(name: str, layer: int, module: str, half: str, shape: list[int], rank: int,
                 shapes: ModelShapes) -> None:
    if layer >= shapes.num_layers:
        raise LoRAError(f"lora adapter {name!r}: layer {layer} does not exist (the model has "
                        f"{shapes.num_layers} layers)")
    if module not in shapes.features:
        raise LoRAError(f"lora adapter {name!r}: the model has no {module!r} to adapt")
    in_features, out_features = shapes.features[module]
    expected = [rank, in_features] if half == "A" else [out_features, rank]
    if shape != expected:
        raise LoRAError(f"lora adapter {name!r}: layer {layer} {module} lora_{half} is {shape}, expected "
                        f"{expected} (r={rank}, the base model's {in_features} -> {out_features} features; "
                        "an adapter for another base model?)")
