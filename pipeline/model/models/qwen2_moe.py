"""Qwen2-MoE (Qwen2MoeForCausalLM): Qwen2's attention (q/k/v biases, switched by `qkv_bias`, default
on; no o bias) with Qwen3-MoE's layer plan and routing (qwen3_moe.py), plus a shared expert.

Each sparse layer adds to its routed experts' sum a shared SwiGLU expert of
`shared_expert_intermediate_size`, scaled per token by sigmoid(shared_expert_gate(x)), a Linear
hidden -> 1 (layers.moe.SharedExpertMoE). Dense layers (`mlp_only_layers`, `decoder_sparse_step`)
are a GatedMLP of `intermediate_size`, as in Qwen3-MoE.

Checkpoint names are Qwen3-MoE's plus `mlp.shared_expert.gate_proj|up_proj|down_proj.weight` (gate and
up fused here into `shared_expert.gate_up_proj`) and `mlp.shared_expert_gate.weight`.
LoRA and tensor parallelism refuse it, as every mixture-of-experts model.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from pipeline.model.attention.paged import AttentionBackend
from pipeline.model.attention.shape import AttentionShape
from pipeline.model.layers.moe import SharedExpertMoE
from pipeline.model.models import llama
from pipeline.model.models.llama import Index
from pipeline.model.models.qwen3_moe import MoeConfig, MoeModel, Qwen3MoeForCausalLM, moe_config


def qwen2_moe_config(config: dict[str, Any], max_positions: int) -> MoeConfig:
    base = moe_config(config, max_positions, "Qwen2-MoE")
    shared = int(config.get("shared_expert_intermediate_size", 0) or 0)
    if base.num_experts and shared < 1:
        raise ValueError(f"Qwen2-MoE shared_expert_intermediate_size must be >= 1, got {shared}")
    return replace(base, qkv_bias=bool(config.get("qkv_bias", True)), o_bias=False, qk_norm=False,
                   shared_expert_intermediate_size=shared)


def attention_shape(config: dict[str, Any]) -> AttentionShape:
    qwen2_moe_config(config, max_positions=1)  # the checks
    return llama.attention_shape(config)


def build_model(config: dict[str, Any], backend: AttentionBackend, max_positions: int) -> Qwen2MoeForCausalLM:
    return Qwen2MoeForCausalLM(qwen2_moe_config(config, max_positions), backend)


class Qwen2MoeModel(MoeModel):
    @staticmethod
    def sparse_mlp(config: MoeConfig) -> SharedExpertMoE:
        return SharedExpertMoE(config.hidden_size, config.moe_intermediate_size, config.num_experts,
                               config.num_experts_per_tok, config.shared_expert_intermediate_size,
                               norm_topk_prob=config.norm_topk_prob)


class Qwen2MoeForCausalLM(Qwen3MoeForCausalLM):
    """Serves Qwen2MoeForCausalLM checkpoints."""

    decoder_class = Qwen2MoeModel

    def locate(self, name: str) -> tuple[str, Index]:
        """The shared expert's gate/up rows are split by its own size, not intermediate_size.

        "model.layers.0.mlp.shared_expert.up_proj.weight" -> ("model.layers.0.mlp.shared_expert.gate_up_proj.weight",
        rows S..2S) with S = shared_expert_intermediate_size.
        """
        module, _, kind = name.rpartition(".")
        prefix, _, proj = module.rpartition(".")
        if not prefix.endswith(".shared_expert") or proj not in ("gate_proj", "up_proj"):
            return super().locate(name)
        size = self.config.shared_expert_intermediate_size
        rows = slice(0, size) if proj == "gate_proj" else slice(size, 2 * size)
        return f"{prefix}.gate_up_proj.{kind}", rows
