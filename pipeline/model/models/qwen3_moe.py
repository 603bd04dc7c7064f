"""Qwen3-MoE (Qwen3MoeForCausalLM): Qwen3's attention (per-head q/k RMSNorm, head_dim from the
config, no biases by default) with routed-expert MLPs on some layers and dense MLPs on the rest.

What differs from Llama, each as HF transformers computes it:
- layer i is sparse iff i is not in `mlp_only_layers`, num_experts > 0 and
  (i + 1) % decoder_sparse_step == 0; sparse layers run top-k of `num_experts` SwiGLU experts of
  `moe_intermediate_size` (pipeline/model/layers/moe.py), dense layers a GatedMLP of `intermediate_size`;
- `norm_topk_prob` (default False) says whether the k routing weights are renormalised to sum to 1;
  they are rounded to the model dtype before scaling the experts' outputs (Mixtral keeps float32).
config.json names the expert count `num_experts` or (as transformers v5 writes it) `num_local_experts`.

Checkpoints name the experts per expert, `model.layers.N.mlp.experts.E.gate_proj|up_proj|down_proj.weight`
(what `save_pretrained` writes), or fused as in HF v5's memory (`mlp.experts.gate_up_proj` [E, 2I, H],
`mlp.experts.down_proj` [E, H, I]); the router is `mlp.gate.weight`. Both forms load.

LoRA and tensor parallelism refuse mixture-of-experts models (pipeline/model/lora.py,
parallel/sharding.py), as for Mixtral; the native decode path serves only plain Llama models.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields, replace
from typing import Any

from pipeline.model.attention.paged import AttentionBackend
from pipeline.model.attention.shape import AttentionShape
from pipeline.model.layers.moe import SparseMoE, fused_expert_slot
from pipeline.model.models import llama
from pipeline.model.models.llama import DecoderConfig, DecoderLayer, DecoderModel, Index, LlamaForCausalLM

# "model.layers.3.mlp.experts.5.gate_proj.weight" -> ("model.layers.3.mlp", "5", "gate_proj")
_PER_EXPERT = re.compile(r"(.*\.mlp)\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight")


@dataclass(frozen=True, slots=True)
class MoeConfig(DecoderConfig):
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = False
    sparse_layers: tuple[bool, ...] = ()  # per layer: routed experts (True) or a dense MLP
    shared_expert_intermediate_size: int = 0  # Qwen2-MoE's shared expert (0: none)


def moe_config(config: dict[str, Any], max_positions: int, family: str) -> MoeConfig:
    """The settings both Qwen MoE families read from config.json; attention flags are the caller's."""
    if config.get("hidden_act", "silu") != "silu":
        raise ValueError(f"{family} hidden_act must be 'silu', got {config['hidden_act']!r}")
    base = llama.decoder_config(config, max_positions)
    num_experts = int(config.get("num_experts", config.get("num_local_experts", 0)) or 0)
    step = int(config.get("decoder_sparse_step", 1))
    if step < 1:
        raise ValueError(f"{family} decoder_sparse_step must be >= 1, got {step}")
    mlp_only = set(config.get("mlp_only_layers") or ())
    sparse = tuple(index not in mlp_only and num_experts > 0 and (index + 1) % step == 0
                   for index in range(base.num_layers))
    shared = {field.name: getattr(base, field.name) for field in fields(base)}
    shared.update(mlp_bias=False, num_experts=num_experts,
                  num_experts_per_tok=int(config["num_experts_per_tok"]) if num_experts else 0)
    return MoeConfig(**shared, moe_intermediate_size=int(config.get("moe_intermediate_size", 0) or 0),
                     norm_topk_prob=bool(config.get("norm_topk_prob", False)), sparse_layers=sparse)


def qwen3_moe_config(config: dict[str, Any], max_positions: int) -> MoeConfig:
    bias = bool(config.get("attention_bias", False))
    return replace(moe_config(config, max_positions, "Qwen3-MoE"), qkv_bias=bias, o_bias=bias, qk_norm=True)


def attention_shape(config: dict[str, Any]) -> AttentionShape:
    qwen3_moe_config(config, max_positions=1)  # the checks
    return llama.attention_shape(config)


def build_model(config: dict[str, Any], backend: AttentionBackend, max_positions: int) -> Qwen3MoeForCausalLM:
    return Qwen3MoeForCausalLM(qwen3_moe_config(config, max_positions), backend)


class MoeDecoderLayer(DecoderLayer):
    """Llama's layer with a dense GatedMLP of intermediate_size; MoeModel swaps in experts where sparse."""

    def __init__(self, config: MoeConfig, backend: AttentionBackend, window: int | None = None) -> None:
        super().__init__(replace(config, num_experts=0), backend, window)


class MoeModel(DecoderModel):
    layer_class = MoeDecoderLayer

    def __init__(self, config: MoeConfig, backend: AttentionBackend) -> None:
        super().__init__(config, backend)
        for layer, sparse in zip(self.layers, config.sparse_layers, strict=True):
            if sparse:
                layer.mlp = self.sparse_mlp(config)

    @staticmethod
    def sparse_mlp(config: MoeConfig) -> SparseMoE:
        return SparseMoE(config.hidden_size, config.moe_intermediate_size, config.num_experts,
                         config.num_experts_per_tok, norm_topk_prob=config.norm_topk_prob, round_weights=True)


class Qwen3MoeForCausalLM(LlamaForCausalLM):
    """Serves Qwen3MoeForCausalLM checkpoints; the base of Qwen2-MoE's model."""

    decoder_class = MoeModel
    config: MoeConfig

    def locate(self, name: str) -> tuple[str, Index]:
        """Per-expert tensors land in a slice of the fused expert tensors.

        "model.layers.0.mlp.experts.2.up_proj.weight" -> ("model.layers.0.mlp.experts.gate_up_proj",
        (2, rows I..2I)); gate_proj fills rows 0..I, down_proj the whole of down_proj[2].
        """
        match = _PER_EXPERT.fullmatch(name)
        if match is None:
            return super().locate(name)
        mlp, expert, kind = match[1], int(match[2]), match[3]
        return fused_expert_slot(mlp, expert, kind.removesuffix("_proj"), self.config.moe_intermediate_size,
                                 self.config.num_experts, name)
