"""Mixtral: Mistral's attention (llama.py) with a sparse mixture-of-experts MLP (pipeline/model/layers/moe.py).

Checkpoints name the experts in one of two ways, both loaded:
- per expert (what HF `save_pretrained` writes, v4 and v5 alike):
  `model.layers.N.block_sparse_moe.gate.weight`, `...block_sparse_moe.experts.E.w1|w2|w3.weight`
  (w1 = gate, w3 = up, w2 = down);
- fused 3D tensors (HF v5's in-memory layout, ours too):
  `model.layers.N.mlp.gate.weight`, `...mlp.experts.gate_up_proj` [E, 2I, H], `...mlp.experts.down_proj` [E, H, I].
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from pipeline.model.attention.paged import AttentionBackend
from pipeline.model.attention.shape import AttentionShape
from pipeline.model.layers.moe import fused_expert_slot
from pipeline.model.models import llama
from pipeline.model.models.llama import DecoderConfig, Index, LlamaForCausalLM

# "model.layers.3.block_sparse_moe.experts.5.w1.weight" -> ("model.layers.3", "5", "w1")
_PER_EXPERT = re.compile(r"(.*)\.block_sparse_moe\.experts\.(\d+)\.(w[123])\.weight")
_ROLES = {"w1": "gate", "w3": "up", "w2": "down"}  # Mixtral's names for an expert's projections


def decoder_config(config: dict[str, Any], max_positions: int) -> DecoderConfig:
    if config.get("hidden_act", "silu") != "silu":
        raise ValueError(f"Mixtral hidden_act must be 'silu', got {config['hidden_act']!r}")
    return replace(llama.decoder_config(config, max_positions),
                   qkv_bias=False, o_bias=False, mlp_bias=False,  # HF's Mixtral has no biases
                   num_experts=int(config["num_local_experts"]),
                   num_experts_per_tok=int(config["num_experts_per_tok"]))


def attention_shape(config: dict[str, Any]) -> AttentionShape:
    return llama.attention_shape(config)


def build_model(config: dict[str, Any], backend: AttentionBackend, max_positions: int) -> MixtralForCausalLM:
    return MixtralForCausalLM(decoder_config(config, max_positions), backend)


class MixtralForCausalLM(LlamaForCausalLM):
    """LlamaForCausalLM whose MLPs are SparseMoE; adds the expert weight names to `locate`."""

    def locate(self, name: str) -> tuple[str, Index]:
        """Per-expert tensors land in a slice of the fused expert tensors.

        "model.layers.0.block_sparse_moe.experts.2.w3.weight" -> ("model.layers.0.mlp.experts.gate_up_proj",
        (2, rows I..2I)); w1 fills rows 0..I, w2 the whole of down_proj[2].
        """
        match = _PER_EXPERT.fullmatch(name)
        if match is None:
            return super().locate(name.replace(".block_sparse_moe.", ".mlp."))
        layer, expert, kind = match[1], int(match[2]), match[3]
        return fused_expert_slot(f"{layer}.mlp", expert, _ROLES[kind], self.config.intermediate_size,
                                 self.config.num_experts, name)
