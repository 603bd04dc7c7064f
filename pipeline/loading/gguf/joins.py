"""HF tensors that llama.cpp's converters split (or reshaped), put back together.

Most GGUF tensors are one HF tensor each (architectures.py names them). A few converters split one
HF tensor into several or transposed it; the file's tensors are then first named as parts (HF-style
names with `.weight`/`.bias`, see architectures.py), and a Join per HF tensor rebuilds it, exactly:
every join only moves values.

- gpt-oss (convert_hf_to_gguf.py GptOssModel): `mlp.experts.gate_up_proj` [E, H, 2I], gate and up
  interleaved by column, was transposed to [E, 2I, H] and split into every other row
  (ffn_gate_exps = rows 0, 2, 4, ...; ffn_up_exps = rows 1, 3, 5, ...); its bias [E, 2I] likewise;
  `down_proj` [E, I, H] was transposed to [E, H, I] (its sinks' and down bias's new names are
  mapped in architectures.py).
- Llama 4 (Llama4Model): `feed_forward.experts.gate_up_proj` [E, H, 2I], gate then up, was
  transposed and cut in halves; `down_proj` [E, I, H] transposed.
- Qwen2-MoE: the shared expert's gate, [1, H] in HF, is [H] in files whose converter squeezed it
  (llama.cpp reads either); it is made a row again.
- DeepSeek-V2/V3 (DeepseekV2Model, converters since mid-2025): `self_attn.kv_b_proj`
  [heads * (nope + v), kv_lora_rank] was viewed per head and split into k_b [heads, kv_lora_rank,
  nope] (transposed) and v_b [heads, v, kv_lora_rank]. Older files keep attn_kv_b whole.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True, slots=True)
class Join:
    """`target` (an HF name inside a layer) from `parts` (part names inside the same layer)."""

    target: str
    parts: tuple[str, ...]
    combine: Callable[[list[torch.Tensor], dict[str, Any]], torch.Tensor]


def _interleaved_gate_up(parts: list[torch.Tensor], _config: dict[str, Any]) -> torch.Tensor:
    """gpt-oss: [E, I, H] gate and up -> [E, H, 2I], columns gate0, up0, gate1, up1, ... (the inverse of
    the converter's `x.transpose(-1, -2)[:, ::2]` and `[:, 1::2]`)."""
    gate, up = parts
    return torch.stack((gate, up), dim=2).flatten(1, 2).transpose(1, 2).contiguous()


def _interleaved_bias(parts: list[torch.Tensor], _config: dict[str, Any]) -> torch.Tensor:
    """gpt-oss: [E, I] gate and up biases -> [E, 2I], interleaved as the columns above."""
    gate, up = parts
    return torch.stack((gate, up), dim=-1).flatten(-2)


def _concatenated_gate_up(parts: list[torch.Tensor], _config: dict[str, Any]) -> torch.Tensor:
    """Llama 4: [E, I, H] gate and up -> [E, H, 2I], gate's columns first."""
    return torch.cat(parts, dim=1).transpose(1, 2).contiguous()


def _transposed(parts: list[torch.Tensor], _config: dict[str, Any]) -> torch.Tensor:
    """[E, H, I] (ggml's output-major experts) -> [E, I, H] (HF's input-major)."""
    return parts[0].transpose(1, 2).contiguous()


def _as_row(parts: list[torch.Tensor], _config: dict[str, Any]) -> torch.Tensor:
    return parts[0].reshape(1, -1)


def _kv_b(parts: list[torch.Tensor], config: dict[str, Any]) -> torch.Tensor:
    """DeepSeek: k_b [heads, rank, nope] and v_b [heads, v, rank] -> kv_b [heads * (nope + v), rank]."""
    k_b, v_b = parts
    heads, rank = config["num_attention_heads"], config["kv_lora_rank"]
    expected_k = (heads, rank, config["qk_nope_head_dim"])
    expected_v = (heads, config["v_head_dim"], rank)
    if tuple(k_b.shape) != expected_k or tuple(v_b.shape) != expected_v:
        raise ValueError(f"attn_k_b / attn_v_b have shapes {tuple(k_b.shape)} / {tuple(v_b.shape)}, expected "
                         f"{expected_k} / {expected_v} from the metadata")
    return torch.cat((k_b.transpose(1, 2), v_b), dim=1).reshape(-1, rank).contiguous()


GPT_OSS_JOINS = (
    Join("mlp.experts.gate_up_proj", ("mlp.experts.gate_proj.weight", "mlp.experts.up_proj.weight"),
         _interleaved_gate_up),
    Join("mlp.experts.gate_up_proj_bias", ("mlp.experts.gate_proj.bias", "mlp.experts.up_proj.bias"),
         _interleaved_bias),
    Join("mlp.experts.down_proj", ("mlp.experts.down_proj.weight",), _transposed),
)
LLAMA4_JOINS = (
    Join("feed_forward.experts.gate_up_proj",
         ("feed_forward.experts.gate_proj.weight", "feed_forward.experts.up_proj.weight"), _concatenated_gate_up),
    Join("feed_forward.experts.down_proj", ("feed_forward.experts.down_proj.weight",), _transposed),
)
QWEN2MOE_JOINS = (Join("mlp.shared_expert_gate.weight", ("mlp.shared_expert_gate.weight",), _as_row),)
DEEPSEEK_JOINS = (
    Join("self_attn.kv_b_proj.weight", ("self_attn.k_b_proj.weight", "self_attn.v_b_proj.weight"), _kv_b),
)
NO_JOINS: tuple[Join, ...] = ()


def _layer_and_part(name: str) -> tuple[str, str] | None:
    """"model.layers.3.mlp.experts.gate_proj.weight" -> ("model.layers.3.", "mlp.experts.gate_proj.weight")."""
    if not name.startswith("model.layers."):
        return None
    layer, _, part = name.removeprefix("model.layers.").partition(".")
    return f"model.layers.{layer}.", part


def joined_name(joins: Iterable[Join], name: str) -> str | None:
    """The HF name that part `name` goes into; None when `name` is no join's part."""
    split = _layer_and_part(name)
    if split is None:
        return None
    prefix, part = split
    return next((prefix + join.target for join in joins if part in join.parts), None)


def join_tensors(joins: tuple[Join, ...], weights: dict[str, torch.Tensor],
                 config: dict[str, Any]) -> dict[str, torch.Tensor]:
    """`weights` with every join's parts replaced by its target; ValueError for a part without its partners."""
    if not joins:
        return weights
    layers = sorted({split[0] for name in weights if (split := _layer_and_part(name)) is not None})
    for prefix in layers:
        for join in joins:
            present = [prefix + part for part in join.parts if prefix + part in weights]
            if not present:
                continue
            if len(present) != len(join.parts):
                missing = sorted(set(prefix + part for part in join.parts) - set(present))
                raise ValueError(f"GGUF file has {present} but not {missing}, which {prefix + join.target} needs")
            weights[prefix + join.target] = join.combine([weights.pop(name) for name in present], config)
    return weights
