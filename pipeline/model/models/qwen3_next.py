"""Qwen3-Next and Qwen3.5 (Qwen3NextForCausalLM, Qwen3_5ForCausalLM, Qwen3_5MoeForCausalLM; the Qwen3.5
`...ForConditionalGeneration` checkpoints served text only): hybrid stacks of gated DeltaNet layers (linear
attention with a recurrent state per sequence) and gated full-attention layers, each as HF transformers
computes it:
- linear-attention layers (layers/gated_deltanet.py): a short causal convolution and the gated delta rule
  over a state kept per sequence in the runner's state pool (layers/recurrent_state.py), never in the
  paged KV cache; only the full-attention layers have KV caches (kv_caches holds theirs, in layer order);
- full attention: q_proj yields each head's query and an output gate side by side ([q_h | gate_h] per
  head), the output is multiplied by sigmoid(gate) before o_proj; q and k are RMS-normalised per head in
  the zero-centred form (scale 1 + weight, Gemma's); rope turns only the first `partial_rotary_factor`
  of each head (rotate-half over that part);
- every RMSNorm of the layers and the final one is zero-centred; the gated output norm of the linear
  layers scales by its weight itself;
- MLPs per qwen3_next_config.py: routed experts plus a sigmoid-gated shared expert (layers.moe.SharedExpertMoE),
  or a dense SwiGLU MLP.
Settings: qwen3_next_config.py.

Checkpoint names are HF's. Qwen3.5's linear layers hold `in_proj_qkv`, `in_proj_z`, `in_proj_b`,
`in_proj_a`; Qwen3-Next's hold the same rows grouped by key head (`in_proj_qkvz`: per key head
[q | k | v of its value heads | z of its value heads], `in_proj_ba` likewise), regrouped at load. Experts
load per expert (`mlp.experts.E.gate_proj...`) or fused (`mlp.experts.gate_up_proj`); the multi-token
prediction weights (`mtp.*`) and a multimodal checkpoint's vision tower (`model.visual.*`) are skipped, its
language model (`model.language_model.*`) loads as the text model's `model.*`.

Prefix caching is off and speculative decoding refused for these models (engine.py), as are LoRA (lora.py:
not a Llama-form model), tensor parallelism (runner.py) and pooling (decoder_pooling.py); they run without
CUDA graphs or the native decode path; a beam-search fork recomputes its tokens from the first.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import nn

from pipeline.model.attention.paged import AttentionBackend
from pipeline.model.attention.shape import AttentionShape
from pipeline.model.layers.gated_deltanet import GatedDeltaNet
from pipeline.model.layers.mlp import GatedMLP
from pipeline.model.layers.moe import SharedExpertMoE, fused_expert_slot
from pipeline.model.layers.norms import GemmaRMSNorm
from pipeline.model.layers.recurrent_state import RecurrentStateShape, StateStep
from pipeline.model.layers.rope import RotaryEmbedding, apply_rotary
from pipeline.model.models.llama import Index, copy_weights_in
from pipeline.model.models.qwen3_next_config import HybridConfig, hybrid_config
from pipeline.model.models.qwen3_next_config import text_config as text_config  # the loader's language_config

# "model.layers.3.mlp.experts.5.gate_proj.weight" -> ("model.layers.3.mlp", "5", "gate")
_PER_EXPERT = re.compile(r"(.*\.mlp)\.experts\.(\d+)\.(gate|up|down)_proj\.weight")


def attention_shape(config: dict[str, Any]) -> AttentionShape:
    """The full-attention layers' shape: only they have KV caches."""
    c = hybrid_config(config, max_positions=1)
    return AttentionShape(num_layers=c.num_attention_layers, num_heads=c.num_heads, num_kv_heads=c.num_kv_heads,
                          head_dim=c.head_dim, scale=c.head_dim**-0.5, layer_windows=(None,) * c.num_attention_layers)


def recurrent_state_shape(config: dict[str, Any]) -> RecurrentStateShape:
    """What the linear-attention layers keep per sequence."""
    c = hybrid_config(config, max_positions=1)
    key_size = c.linear_num_key_heads * c.linear_key_head_dim
    return RecurrentStateShape(num_layers=c.num_linear_layers,
                               conv_channels=2 * key_size + c.linear_num_value_heads * c.linear_value_head_dim,
                               conv_kernel=c.conv_kernel, num_heads=c.linear_num_value_heads,
                               key_dim=c.linear_key_head_dim, value_dim=c.linear_value_head_dim)


def build_model(config: dict[str, Any], backend: AttentionBackend, max_positions: int) -> HybridForCausalLM:
    return HybridForCausalLM(hybrid_config(config, max_positions), backend)


class GatedAttention(nn.Module):
    """Full attention with per-head output gates, zero-centred q/k norms and partial rope."""

    def __init__(self, config: HybridConfig, backend: AttentionBackend) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = config.num_heads, config.num_kv_heads, config.head_dim
        self.q_size, self.kv_size = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
        self.rotary_dim = config.rotary_dim
        # rows [q_proj (per head: query, then gate) | k_proj | v_proj]
        self.qkv_proj = nn.Linear(config.hidden_size, 2 * self.q_size + 2 * self.kv_size, bias=config.attention_bias)
        self.o_proj = nn.Linear(self.q_size, config.hidden_size, bias=config.attention_bias)
        self.q_norm = GemmaRMSNorm(config.head_dim, config.rms_norm_eps)
        self.k_norm = GemmaRMSNorm(config.head_dim, config.rms_norm_eps)
        self.backend = backend

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv_cache: torch.Tensor,
                metadata: object) -> torch.Tensor:
        num_tokens = x.shape[0]
        query_gate, k, v = self.qkv_proj(x).split([2 * self.q_size, self.kv_size, self.kv_size], dim=-1)
        query_gate = query_gate.view(num_tokens, self.num_heads, 2 * self.head_dim)
        q, gate = query_gate[..., :self.head_dim], query_gate[..., self.head_dim:]
        q = self._rotate(self.q_norm(q), cos, sin)
        k = self._rotate(self.k_norm(k.view(num_tokens, self.num_kv_heads, self.head_dim)), cos, sin)
        v = v.view(num_tokens, self.num_kv_heads, self.head_dim)
        out = self.backend.forward(q, k, v, kv_cache, metadata, window=None).reshape(num_tokens, self.q_size)
        return self.o_proj(out * torch.sigmoid(gate.reshape(num_tokens, self.q_size)))

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Rope over each head's first rotary_dim dims (rotate-half within them); the rest pass through."""
        return torch.cat((apply_rotary(x[..., :self.rotary_dim], cos, sin), x[..., self.rotary_dim:]), dim=-1)


class HybridDecoderLayer(nn.Module):
    def __init__(self, config: HybridConfig, backend: AttentionBackend, index: int) -> None:
        super().__init__()
        self.is_linear = config.linear_layers[index]
        self.input_layernorm = GemmaRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = GemmaRMSNorm(config.hidden_size, config.rms_norm_eps)
        if self.is_linear:
            self.linear_attn = GatedDeltaNet(config.hidden_size, config.linear_num_key_heads,
                                             config.linear_num_value_heads, config.linear_key_head_dim,
                                             config.linear_value_head_dim, config.conv_kernel, config.rms_norm_eps,
                                             state_index=config.linear_layers[:index].count(True))
        else:
            self.self_attn = GatedAttention(config, backend)
        self.mlp: nn.Module
        if config.sparse_layers[index]:
            self.mlp = SharedExpertMoE(config.hidden_size, config.moe_intermediate_size, config.num_experts,
                                       config.num_experts_per_tok, config.shared_expert_intermediate_size,
                                       norm_topk_prob=config.norm_topk_prob)
        else:
            self.mlp = GatedMLP(config.hidden_size, config.intermediate_size)

    def forward(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv_cache: torch.Tensor | None,
                metadata: object, states: StateStep) -> torch.Tensor:
        normed = self.input_layernorm(hidden)
        if self.is_linear:
            hidden = hidden + self.linear_attn(normed, states)
        else:
            hidden = hidden + self.self_attn(normed, cos, sin, kv_cache, metadata)
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class HybridModel(nn.Module):
    def __init__(self, config: HybridConfig, backend: AttentionBackend) -> None:
        super().__init__()
        # An explicit (uninitialised) weight skips nn.Embedding's random init (llama.py's DecoderModel).
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size,
                                         _weight=torch.empty(config.vocab_size, config.hidden_size))
        self.layers = nn.ModuleList(HybridDecoderLayer(config, backend, index) for index in range(config.num_layers))
        self.norm = GemmaRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(config.rotary_dim, config.max_positions, config.rope)


class HybridForCausalLM(nn.Module):
    """Serves every architecture of this module (their differences are settings: qwen3_next_config.py)."""

    def __init__(self, config: HybridConfig, backend: AttentionBackend) -> None:
        super().__init__()
        self.config = config
        self.model = HybridModel(config, backend)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.tie_weights()

    def tie_weights(self) -> None:
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def build_buffers(self, device: torch.device) -> None:
        self.model.rotary_emb.build(device)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, metadata: object,
                kv_caches: list[torch.Tensor], states: StateStep | None = None) -> torch.Tensor:
        """input_ids, positions [T] -> hidden states [T, hidden_size], final norm applied; `states`: the
        step's view of the runner's state pool (required: the linear layers read and update it)."""
        if states is None:
            raise ValueError(f"{self.config.architecture} keeps a recurrent state per sequence: its forward needs "
                             "the step's state slots (the engine's generate path passes them)")
        hidden = self.model.embed_tokens(input_ids)
        cos, sin = self.model.rotary_emb.lookup(positions, hidden.dtype)
        caches = iter(kv_caches)
        for layer in self.model.layers:
            hidden = layer(hidden, cos, sin, None if layer.is_linear else next(caches), metadata, states)
        return self.model.norm(hidden)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[R, hidden_size] -> float32 logits [R, vocab_size]."""
        widened = getattr(self.lm_head, "forward_float32", None)  # native heads write float32 themselves
        logits = widened(hidden) if widened is not None else None
        return logits if logits is not None else self.lm_head(hidden).float()

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy checkpoint tensors into the (possibly fused) parameters; raise if any part is missing."""
        copy_weights_in(self, self._language_model_weights(weights), self.locate, self.config.tie_word_embeddings)

    def _language_model_weights(self, weights: Iterable[tuple[str, torch.Tensor]],
                                ) -> Iterator[tuple[str, torch.Tensor]]:
        """The text model's tensors under HybridForCausalLM's module names, Qwen3-Next's grouped projections
        split into Qwen3.5's; multi-token prediction and vision weights skipped."""
        for name, tensor in weights:
            if name.startswith(("mtp.", "model.visual.", "visual.")):
                continue
            if name.startswith("model.language_model."):
                name = "model." + name.removeprefix("model.language_model.")
            if name.endswith("linear_attn.in_proj_qkvz.weight"):
                yield from self._split_qkvz(name.removesuffix("qkvz.weight"), tensor)
            elif name.endswith("linear_attn.in_proj_ba.weight"):
                prefix = name.removesuffix("ba.weight")
                repeat = self.config.linear_num_value_heads // self.config.linear_num_key_heads
                b, a = tensor.view(self.config.linear_num_key_heads, 2 * repeat, -1).split([repeat, repeat], dim=1)
                yield f"{prefix}b.weight", b.reshape(-1, tensor.shape[-1])
                yield f"{prefix}a.weight", a.reshape(-1, tensor.shape[-1])
            else:
                yield name, tensor

    def _split_qkvz(self, prefix: str, tensor: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
        """Qwen3-Next's in_proj_qkvz rows, grouped per key head g as [q_g | k_g | v of g's value heads | z of
        them], -> Qwen3.5's in_proj_qkv ([all q | all k | all v]) and in_proj_z."""
        c = self.config
        repeat = c.linear_num_value_heads // c.linear_num_key_heads
        key, value = c.linear_key_head_dim, repeat * c.linear_value_head_dim
        grouped = tensor.view(c.linear_num_key_heads, 2 * key + 2 * value, -1)
        q, k, v, z = (part.reshape(-1, tensor.shape[-1]) for part in grouped.split([key, key, value, value], dim=1))
        yield f"{prefix}qkv.weight", torch.cat([q, k, v])
        yield f"{prefix}z.weight", z

    def locate(self, name: str) -> tuple[str, Index]:
        """The parameter a checkpoint tensor belongs to, and which part of it.

        "model.layers.3.self_attn.k_proj.weight" -> ("model.layers.3.self_attn.qkv_proj.weight", rows 2Q..2Q+KV)
        "model.layers.0.linear_attn.in_proj_z.weight" -> ("model.layers.0.linear_attn.in_proj.weight", rows of z)
        "model.layers.0.mlp.experts.2.up_proj.weight" -> ("model.layers.0.mlp.experts.gate_up_proj", (2, rows I..2I))
        """
        c = self.config
        match = _PER_EXPERT.fullmatch(name)
        if match is not None:
            return fused_expert_slot(match[1], int(match[2]), match[3], c.moe_intermediate_size, c.num_experts, name)
        module, _, kind = name.rpartition(".")
        prefix, _, part = module.rpartition(".")
        q_size, kv_size = 2 * c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
        if prefix.endswith(".self_attn") and part in ("q_proj", "k_proj", "v_proj"):
            return f"{prefix}.qkv_proj.{kind}", _rows([q_size, kv_size, kv_size], ("q_proj", "k_proj", "v_proj"), part)
        if prefix.endswith(".linear_attn") and part in ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a"):
            key_size = c.linear_num_key_heads * c.linear_key_head_dim
            value_size, heads = c.linear_num_value_heads * c.linear_value_head_dim, c.linear_num_value_heads
            return f"{prefix}.in_proj.{kind}", _rows([2 * key_size + value_size, value_size, heads, heads],
                                                     ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a"), part)
        if part in ("gate_proj", "up_proj") and (prefix.endswith((".mlp", ".shared_expert"))):
            size = c.shared_expert_intermediate_size if prefix.endswith(".shared_expert") else c.intermediate_size
            return f"{prefix}.gate_up_proj.{kind}", _rows([size, size], ("gate_proj", "up_proj"), part)
        return name, slice(None)


def _rows(sizes: list[int], parts: tuple[str, ...], part: str) -> slice:
    """Rows of `part` in a fused matrix whose parts, in order, have `sizes` rows: ([2, 3], (a, b), b) -> 2..5."""
    index = parts.index(part)
    start = sum(sizes[:index])
    return slice(start, start + sizes[index])

