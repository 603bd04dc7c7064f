"""DeepSeek-V2 and DeepSeek-V3 (DeepseekV2ForCausalLM, DeepseekV3ForCausalLM): multi-head latent
attention over a latent KV cache, and mixture-of-experts MLPs with shared experts and grouped routing.

What differs from Llama, each as HF transformers computes it:
- attention is MLA (deepseek_attention.py): the paged cache holds kv_lora_rank + qk_rope_head_dim
  values per token and layer (attention/latent.py), one row every head reads; queries come from
  q_proj (q_lora_rank null, V2-Lite) or q_a_proj -> q_a_layernorm -> q_b_proj; the rope spans
  qk_rope_head_dim, with YaRN's cos/sin scaling from layers/rope.py and its softmax-scale factor
  from deepseek_config.py;
- layer i has a dense SwiGLU MLP of intermediate_size when i < first_k_dense_replace, else routed
  experts of moe_intermediate_size plus n_shared_experts shared ones (layers/grouped_moe.py): V2
  routes by softmax (greedy or group_limited_greedy), V3 by sigmoid (noaux_tc, with
  e_score_correction_bias); the settings HF reads, and those refused, are in deepseek_config.py.

Checkpoint names are HF's: `self_attn.{q_proj | q_a_proj, q_a_layernorm, q_b_proj}`,
`kv_a_proj_with_mqa`, `kv_a_layernorm`, `kv_b_proj`, `o_proj`; `mlp.gate.weight` (and
`mlp.gate.e_score_correction_bias`), per-expert `mlp.experts.E.{gate,up,down}_proj.weight` or the
fused `mlp.experts.gate_up_proj`/`down_proj`, `mlp.shared_experts.{gate,up,down}_proj.weight`.
V3's multi-token-prediction layers (`model.layers.N.*` with N >= num_hidden_layers) are skipped.

Served on the CPU's torch path only: LoRA, an fp8 KV cache and CUDA each refuse it by name
(lora.py, runner.py, attention/selection.py). Tensor parallelism splits it by heads and expert
columns (parallel/latent_sharding.py).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any, ClassVar

import torch
from torch import nn

from pipeline.model.attention.latent import LatentPagedAttention
from pipeline.model.attention.shape import AttentionShape
from pipeline.model.layers.grouped_moe import GroupedMoE
from pipeline.model.layers.mlp import GatedMLP
from pipeline.model.layers.moe import fused_expert_slot
from pipeline.model.layers.norms import RMSNorm
from pipeline.model.models.deepseek_attention import LatentAttention
from pipeline.model.models.deepseek_config import DeepseekConfig, deepseek_config
from pipeline.model.models.llama import DecoderModel, Index, LlamaForCausalLM

# "model.layers.3.mlp.experts.5.gate_proj.weight" -> ("model.layers.3.mlp", "5", "gate")
_PER_EXPERT = re.compile(r"(.*\.mlp)\.experts\.(\d+)\.(gate|up|down)_proj\.weight")
_LAYER = re.compile(r"model\.layers\.(\d+)\.")


def attention_shape(config: dict[str, Any]) -> AttentionShape:
    c = deepseek_config(config, max_positions=1)
    return AttentionShape(num_layers=c.num_layers, num_heads=c.num_heads, num_kv_heads=1,
                          head_dim=c.kv_lora_rank + c.qk_rope_head_dim, scale=c.scale,
                          layer_windows=(None,) * c.num_layers, latent_dim=c.kv_lora_rank)


def build_model(config: dict[str, Any], backend: LatentPagedAttention, max_positions: int) -> DeepseekForCausalLM:
    return DeepseekForCausalLM(deepseek_config(config, max_positions), backend)


class DeepseekDecoderLayer(nn.Module):
    def __init__(self, config: DeepseekConfig, backend: LatentPagedAttention, window: int | None = None) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = LatentAttention(config, backend, window)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp: nn.Module = GatedMLP(config.hidden_size, config.intermediate_size, bias=config.mlp_bias)

    def forward(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv_cache: torch.Tensor,
                metadata: object) -> torch.Tensor:
        hidden = hidden + self.self_attn(self.input_layernorm(hidden), cos, sin, kv_cache, metadata)
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class DeepseekModel(DecoderModel):
    layer_class = DeepseekDecoderLayer

    def __init__(self, config: DeepseekConfig, backend: LatentPagedAttention) -> None:  # type: ignore[override]
        super().__init__(config, backend)  # type: ignore[arg-type]
        if config.routing is None:
            return
        for index in range(config.first_k_dense_replace, config.num_layers):
            self.layers[index].mlp = GroupedMoE(config.hidden_size, config.moe_intermediate_size, config.routing,
                                                config.n_shared_experts, bias=config.mlp_bias)


class DeepseekForCausalLM(LlamaForCausalLM):
    """Serves DeepseekV2ForCausalLM and DeepseekV3ForCausalLM checkpoints."""

    decoder_class = DeepseekModel
    # Only gate/up are fused here: q_proj is MLA's own.
    _FUSED: ClassVar[dict[str, tuple[str, int]]] = {"gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1)}
    config: DeepseekConfig

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """HF's loading, less V3's multi-token-prediction layers (past num_hidden_layers), which serve no step."""
        super().load_weights((name, tensor) for name, tensor in weights if not self._is_extra_layer(name))

    def _is_extra_layer(self, name: str) -> bool:
        match = _LAYER.match(name)
        return match is not None and int(match[1]) >= self.config.num_layers

    def locate(self, name: str) -> tuple[str, Index]:
        """Per-expert tensors into the fused expert tensors; the shared experts' gate/up rows by their size.

        "model.layers.1.mlp.shared_experts.up_proj.weight" -> ("model.layers.1.mlp.shared_experts.gate_up_proj.weight",
        rows S..2S) with S = n_shared_experts * moe_intermediate_size.
        """
        c = self.config
        match = _PER_EXPERT.fullmatch(name)
        if match is not None:
            return fused_expert_slot(match[1], int(match[2]), match[3], c.moe_intermediate_size, c.num_experts, name)
        module, _, kind = name.rpartition(".")
        prefix, _, proj = module.rpartition(".")
        if prefix.endswith(".shared_experts") and proj in ("gate_proj", "up_proj"):
            size = c.n_shared_experts * c.moe_intermediate_size
            rows = slice(0, size) if proj == "gate_proj" else slice(size, 2 * size)
            return f"{prefix}.gate_up_proj.{kind}", rows
        return super().locate(name)
