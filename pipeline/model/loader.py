"""Load a local HF model directory: config.json, safetensors weights (single or sharded), EOS ids.

The architectures served, and the module serving each, are listed in pipeline/model/models.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog
import torch
from safetensors import safe_open

from pipeline.model.attention.fp8_kv import split_kv_scales
from pipeline.model.attention.paged import AttentionBackend
from pipeline.model.attention.shape import AttentionShape
from pipeline.model.cpu.library import cpu_has_bfloat16_arithmetic
from pipeline.model.layers.recurrent_state import RecurrentStateShape
from pipeline.model.models import family_of

log = structlog.get_logger(__name__)

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """What the engine needs to know about a model, beyond its weights."""

    architecture: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_position_embeddings: int
    eos_token_ids: tuple[int, ...]
    dtype: torch.dtype
    attention: AttentionShape
    # What linear-attention layers keep per sequence (Qwen3-Next, Qwen3.5: layers/recurrent_state.py); None: nothing.
    recurrent_state: RecurrentStateShape | None = None


def resolve_device(name: str) -> torch.device:
    """'auto' -> cuda when available, else cpu."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} requested but CUDA is not available")
    return device


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """'auto', as vLLM reads it on a CPU: bfloat16 where the CPU multiplies it natively (AVX512-BF16 or
    AMX), else float32; bfloat16 on CUDA. float32 is the dtype to compare with HF bit for bit."""
    if name == "auto":
        if device.type == "cuda" or cpu_has_bfloat16_arithmetic():
            return torch.bfloat16
        return torch.float32
    if name not in _DTYPES:
        raise ValueError(f"dtype must be one of {('auto', *_DTYPES)}, got {name!r}")
    return _DTYPES[name]


def _read_json(path: Path) -> dict[str, Any]:
    with path.open() as f:
        return json.load(f)


def read_config(model_dir: str | Path) -> dict[str, Any]:
    """config.json, after checking that its architecture is supported."""
    config = _read_json(Path(model_dir) / "config.json")
    architectures = config.get("architectures") or ["(none)"]
    family_of(architectures[0])  # raises for an unsupported architecture, naming the supported ones
    return config


def architecture_of(config: dict[str, Any]) -> str:
    return config["architectures"][0]


def attention_shape(config: dict[str, Any]) -> AttentionShape:
    return family_of(architecture_of(config)).attention_shape(config)


def recurrent_state_shape(config: dict[str, Any]) -> RecurrentStateShape | None:
    """The per-sequence state of a family with linear-attention layers; None for the others."""
    family = family_of(architecture_of(config))
    return family.recurrent_state_shape(config) if hasattr(family, "recurrent_state_shape") else None


def language_config(config: dict[str, Any]) -> dict[str, Any]:
    """The language model's part of config.json: a vision-language model's text_config, else all of it."""
    family = family_of(architecture_of(config))
    return family.text_config(config) if hasattr(family, "text_config") else config


def read_eos_token_ids(model_dir: str | Path, config: dict[str, Any]) -> tuple[int, ...]:
    """generation_config.json's eos_token_id (int or list), else config.json's, else none."""
    eos = None
    generation_path = Path(model_dir) / "generation_config.json"
    if generation_path.exists():
        eos = _read_json(generation_path).get("eos_token_id")
    if eos is None:
        eos = config.get("eos_token_id", language_config(config).get("eos_token_id"))
    if eos is None:
        return ()
    return tuple(int(token) for token in (eos if isinstance(eos, list) else [eos]))


def read_model_info(model_dir: str | Path, dtype: torch.dtype) -> ModelInfo:
    config = read_config(model_dir)
    shape = attention_shape(config)
    text = language_config(config)
    return ModelInfo(
        architecture=architecture_of(config), vocab_size=text["vocab_size"],
        hidden_size=text["hidden_size"], num_layers=shape.num_layers, num_heads=shape.num_heads,
        num_kv_heads=shape.num_kv_heads, head_dim=shape.head_dim,
        max_position_embeddings=text["max_position_embeddings"],
        eos_token_ids=read_eos_token_ids(model_dir, config), dtype=dtype, attention=shape,
        recurrent_state=recurrent_state_shape(config))


def weight_files(model_dir: str | Path) -> list[Path]:
    """model.safetensors, or the shards named by model.safetensors.index.json."""
    model_dir = Path(model_dir)
    index = model_dir / "model.safetensors.index.json"
    if index.exists():
        return [model_dir / name for name in sorted(set(_read_json(index)["weight_map"].values()))]
    single = model_dir / "model.safetensors"
    if single.exists():
        return [single]
    raise FileNotFoundError(f"no model.safetensors or model.safetensors.index.json in {model_dir}")


def iter_weights(model_dir: str | Path) -> Iterator[tuple[str, torch.Tensor]]:
    for path in weight_files(model_dir):
        with safe_open(str(path), framework="pt", device="cpu") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open handles are not iterable
                yield name, f.get_tensor(name)


def materialize(model: torch.nn.Module, dtype: torch.dtype, device: torch.device) -> None:
    """Give every meta parameter and buffer uninitialised storage on `device` (floats in `dtype`).

    This is what `model.to(dtype).to_empty(device)` does, but `to_empty` goes through torch's
    Python reference of `empty_like`, whose first call imports sympy: ~0.3 s of start-up.
    """
    for module in model.modules():
        for table in (module._parameters, module._buffers):
            for name, tensor in table.items():
                if tensor is None:
                    continue
                storage = torch.empty(tensor.shape, device=device,
                                      dtype=dtype if tensor.is_floating_point() else tensor.dtype)
                table[name] = (torch.nn.Parameter(storage, requires_grad=tensor.requires_grad)
                               if isinstance(tensor, torch.nn.Parameter) else storage)


def load_model(model_dir: str | Path, backend: AttentionBackend, *, dtype: torch.dtype,
               device: torch.device, max_positions: int,
               kv_scales: dict[int, dict[str, float]] | None = None) -> tuple[torch.nn.Module, ModelInfo]:
    """Build the model without initialising weights (meta device), then copy the checkpoint in.

    The checkpoint's KV-cache scales (`k_scale`, `v_scale`, `kv_scale` per layer) are no model
    weights: they go into `kv_scales` by layer (attention/fp8_kv.py), and are dropped when it is None."""
    info = read_model_info(model_dir, dtype)
    config = read_config(model_dir)
    with torch.device("meta"):
        model = family_of(info.architecture).build_model(config, backend, max_positions)
    materialize(model, dtype, device)
    model.tie_weights()  # materialize gives a shared Parameter two separate tensors (no-op if untied)
    model.load_weights(split_kv_scales(iter_weights(model_dir), {} if kv_scales is None else kv_scales))
    model.build_buffers(device)
    log.info("model loaded", architecture=info.architecture, dtype=str(dtype), device=str(device),
             num_params=sum(p.numel() for p in model.parameters()))
    return model.eval(), info
