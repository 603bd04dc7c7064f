"""Load a local HF model directory: config.json, safetensors weights (single or sharded), EOS ids.

Supported: LlamaForCausalLM (incl. llama3 rope scaling), Qwen2ForCausalLM, Qwen3ForCausalLM.
Both config forms are accepted: the old one (`rope_theta`, `rope_scaling`) and transformers
v5's `rope_parameters` dict.
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

from pipeline.model.attention import AttentionBackend
from pipeline.model.layers import RopeParams
from pipeline.model.models.llama import DecoderConfig, LlamaForCausalLM

log = structlog.get_logger(__name__)

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")
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


def resolve_device(name: str) -> torch.device:
    """'auto' -> cuda when available, else cpu."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} requested but CUDA is not available")
    return device


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """'auto' -> float32 on CPU (bit-comparable with HF), bfloat16 on CUDA."""
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if name not in _DTYPES:
        raise ValueError(f"dtype must be one of {('auto', *_DTYPES)}, got {name!r}")
    return _DTYPES[name]


def _read_json(path: Path) -> dict[str, Any]:
    with path.open() as f:
        return json.load(f)


def read_config(model_dir: str | Path) -> dict[str, Any]:
    """config.json, after checking that its architecture is supported."""
    config = _read_json(Path(model_dir) / "config.json")
    architectures = config.get("architectures") or []
    if not architectures or architectures[0] not in SUPPORTED_ARCHITECTURES:
        raise ValueError(f"architecture {architectures} is not supported; supported architectures: "
                         f"{', '.join(SUPPORTED_ARCHITECTURES)}")
    return config


def parse_rope(config: dict[str, Any]) -> RopeParams:
    """Rope settings from `rope_parameters` (v5) or `rope_theta` + `rope_scaling` (older)."""
    params = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
    rope_type = params.get("rope_type", params.get("type", "default"))
    theta = float(params.get("rope_theta", config.get("rope_theta", 10000.0)))
    if rope_type == "default":
        return RopeParams(theta=theta)
    if rope_type != "llama3":
        raise ValueError(f"rope type must be 'default' or 'llama3', got {rope_type!r}")
    original = params.get("original_max_position_embeddings", config.get("max_position_embeddings", 8192))
    return RopeParams(theta=theta, rope_type="llama3", factor=float(params["factor"]),
                      low_freq_factor=float(params["low_freq_factor"]),
                      high_freq_factor=float(params["high_freq_factor"]),
                      original_max_position_embeddings=int(original))


def read_eos_token_ids(model_dir: str | Path, config: dict[str, Any]) -> tuple[int, ...]:
    """generation_config.json's eos_token_id (int or list), else config.json's, else none."""
    eos = None
    generation_path = Path(model_dir) / "generation_config.json"
    if generation_path.exists():
        eos = _read_json(generation_path).get("eos_token_id")
    if eos is None:
        eos = config.get("eos_token_id")
    if eos is None:
        return ()
    return tuple(int(token) for token in (eos if isinstance(eos, list) else [eos]))


def decoder_config(config: dict[str, Any], max_positions: int) -> DecoderConfig:
    architecture = config["architectures"][0]
    num_heads = config["num_attention_heads"]
    attention_bias = bool(config.get("attention_bias", False))
    if config.get("use_sliding_window"):
        log.warning("sliding window attention is not implemented; using full attention",
                    architecture=architecture)
    return DecoderConfig(
        vocab_size=config["vocab_size"],
        hidden_size=config["hidden_size"],
        intermediate_size=config["intermediate_size"],
        num_layers=config["num_hidden_layers"],
        num_heads=num_heads,
        num_kv_heads=config.get("num_key_value_heads") or num_heads,
        head_dim=config.get("head_dim") or config["hidden_size"] // num_heads,
        rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
        rope=parse_rope(config),
        max_positions=max_positions,
        qkv_bias=True if architecture == "Qwen2ForCausalLM" else attention_bias,
        o_bias=False if architecture == "Qwen2ForCausalLM" else attention_bias,
        mlp_bias=bool(config.get("mlp_bias", False)),
        qk_norm=architecture == "Qwen3ForCausalLM",
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
    )


def read_model_info(model_dir: str | Path, dtype: torch.dtype) -> ModelInfo:
    config = read_config(model_dir)
    decoder = decoder_config(config, config["max_position_embeddings"])
    return ModelInfo(
        architecture=config["architectures"][0], vocab_size=decoder.vocab_size,
        hidden_size=decoder.hidden_size, num_layers=decoder.num_layers, num_heads=decoder.num_heads,
        num_kv_heads=decoder.num_kv_heads, head_dim=decoder.head_dim,
        max_position_embeddings=config["max_position_embeddings"],
        eos_token_ids=read_eos_token_ids(model_dir, config), dtype=dtype)


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
               device: torch.device, max_positions: int) -> tuple[LlamaForCausalLM, ModelInfo]:
    """Build the model without initialising weights (meta device), then copy the checkpoint in."""
    info = read_model_info(model_dir, dtype)
    config = decoder_config(read_config(model_dir), max_positions)
    with torch.device("meta"):
        model = LlamaForCausalLM(config, backend)
    materialize(model, dtype, device)
    if config.tie_word_embeddings:
        model.tie_weights()  # materialize gives a shared Parameter two separate tensors
    model.load_weights(iter_weights(model_dir))
    model.model.rotary_emb.build(device)
    log.info("model loaded", architecture=info.architecture, dtype=str(dtype), device=str(device),
             num_params=sum(p.numel() for p in model.parameters()))
    return model.eval(), info
