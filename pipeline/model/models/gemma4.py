"""Gemma 4, text (Gemma4ForCausalLM, dense): Gemma 3's layer order (four norms, GELU-tanh MLP,
embeddings times sqrt(hidden_size)) with these differences, each as HF transformers computes it:
- every RMSNorm scales by its weight itself (not 1 + weight), in float32, rounding last; values are
  RMS-normalised too, without a weight; attention scores are not scaled (scale 1.0);
- global layers have wider heads (and, with attention_k_eq_v, fewer KV heads whose values are the
  keys' projection), and a proportional rope (gemma4_config.py);
- the last `num_kv_shared_layers` layers reuse the keys and values of the last earlier layer of their
  kind (they have no k/v projections; with use_double_wide_mlp their MLP is twice as wide);
- per-layer input embeddings (PLE): each layer adds a gated projection of a per-layer vector, made of
  the token's row of `embed_tokens_per_layer` and a projection of its embedding;
- each layer's output is multiplied by its `layer_scalar`; the final logits are soft-capped if set.
One KV cache shape serves every layer, so a layer's keys and values are zero-padded to the widest
head and its KV heads repeated to the most any layer has: the attention is the same (zeros add
nothing to q.k, and padded value columns are dropped), at the cost of cache memory on the narrower
layers. A reusing layer writes the keys and values it reuses into its own cache (it attends there).
Not served yet: the mixture-of-experts block (26B-A4B), multimodal checkpoints, LoRA, tensor parallelism.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from pipeline.model.attention.paged import AttentionBackend
from pipeline.model.attention.shape import AttentionShape
from pipeline.model.layers.mlp import GatedMLP
from pipeline.model.layers.norms import Float32RMSNorm
from pipeline.model.layers.rope import apply_rotary
from pipeline.model.models.gemma4_config import Gemma4Config, LayerSpec, RotarySpec, gemma4_config

_gelu_tanh = functools.partial(F.gelu, approximate="tanh")
KeysValues = tuple[torch.Tensor, torch.Tensor]  # one step's keys and values in the cache layout


def attention_shape(config: dict[str, Any]) -> AttentionShape:
    gemma = gemma4_config(config, max_positions=1)
    return AttentionShape(num_layers=len(gemma.layers), num_heads=gemma.num_heads, num_kv_heads=gemma.cache_kv_heads,
                          head_dim=gemma.cache_head_dim, scale=1.0,
                          layer_windows=tuple(layer.window for layer in gemma.layers))


def build_model(config: dict[str, Any], backend: AttentionBackend, max_positions: int) -> Gemma4ForCausalLM:
    return Gemma4ForCausalLM(gemma4_config(config, max_positions), backend)


def rms_normalize(x: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm without a weight (HF's with_scale=False), in float32, rounded last."""
    x_f32 = x.float()
    return (x_f32 * torch.rsqrt(x_f32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


class ProportionalRotaryEmbedding(nn.Module):
    """HF's proportional rope: the first `rotary_fraction` of the frequency pairs turn at
    theta ** (-2i / head_dim) (over the whole head), the rest have frequency 0 and stay; fraction
    1.0 is the default rope (the sliding layers'). A cos/sin table per position, as RotaryEmbedding."""

    def __init__(self, head_dim: int, max_positions: int, spec: RotarySpec) -> None:
        super().__init__()
        self.head_dim, self.max_positions, self.spec = head_dim, max_positions, spec
        self.register_buffer("cos_sin", torch.empty(0), persistent=False)

    def build(self, device: torch.device | str) -> None:
        turning = int(self.spec.rotary_fraction * self.head_dim // 2)
        exponents = torch.arange(0, 2 * turning, 2, dtype=torch.int64).float() / self.head_dim
        inv_freq = torch.cat([1.0 / (self.spec.theta**exponents), torch.zeros(self.head_dim // 2 - turning)])
        positions = torch.arange(self.max_positions, dtype=torch.int64).float()
        freqs = (positions[:, None] * inv_freq[None, :]).to(device)  # [P, D/2]
        self.cos_sin = torch.stack([freqs.cos(), freqs.sin()])

    def lookup(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin for each token: [T, 1, D/2]."""
        cos_sin = self.cos_sin[:, positions].to(dtype)
        return cos_sin[0].unsqueeze(1), cos_sin[1].unsqueeze(1)


class Gemma4Attention(nn.Module):
    def __init__(self, config: Gemma4Config, spec: LayerSpec, backend: AttentionBackend) -> None:
        super().__init__()
        self.spec, self.backend = spec, backend
        self.num_heads, self.eps = config.num_heads, config.rms_norm_eps
        self.cache_head_dim, self.cache_kv_heads = config.cache_head_dim, config.cache_kv_heads
        size, bias, q_size = config.hidden_size, config.attention_bias, config.num_heads * spec.head_dim
        self.q_proj = nn.Linear(size, q_size, bias=bias)
        self.q_norm = Float32RMSNorm(spec.head_dim, config.rms_norm_eps)
        if spec.kv_source is None:
            self.k_proj = nn.Linear(size, spec.num_kv_heads * spec.head_dim, bias=bias)
            self.v_proj = None if spec.k_eq_v else nn.Linear(size, spec.num_kv_heads * spec.head_dim, bias=bias)
            self.k_norm = Float32RMSNorm(spec.head_dim, config.rms_norm_eps)
        self.o_proj = nn.Linear(q_size, size, bias=bias)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv_cache: torch.Tensor,
                metadata: object, shared: KeysValues | None) -> tuple[torch.Tensor, KeysValues]:
        """-> (output [T, hidden], this step's keys and values in the cache layout, for reusing layers)."""
        num_tokens, head_dim = x.shape[0], self.spec.head_dim
        q = apply_rotary(self.q_norm(self.q_proj(x).view(num_tokens, self.num_heads, head_dim)), cos, sin)
        k, v = shared if shared is not None else self._keys_values(x, cos, sin)
        out = self.backend.forward(self._pad(q), k, v, kv_cache, metadata, window=self.spec.window)
        return self.o_proj(out[..., :head_dim].reshape(num_tokens, -1)), (k, v)

    def _keys_values(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> KeysValues:
        shape = (x.shape[0], self.spec.num_kv_heads, self.spec.head_dim)
        raw_k = self.k_proj(x).view(shape)
        raw_v = raw_k if self.v_proj is None else self.v_proj(x).view(shape)
        k = apply_rotary(self.k_norm(raw_k), cos, sin)
        return self._to_cache_layout(k), self._to_cache_layout(rms_normalize(raw_v, self.eps))

    def _to_cache_layout(self, x: torch.Tensor) -> torch.Tensor:
        """[T, kv, d] -> [T, cache kv heads, cache head_dim]: heads repeated in place (query head h
        reads KV head h // group either way), zero-padded to the widest head."""
        return self._pad(x.repeat_interleave(self.cache_kv_heads // x.shape[1], dim=1))

    def _pad(self, x: torch.Tensor) -> torch.Tensor:
        return F.pad(x, (0, self.cache_head_dim - x.shape[-1]))


class Gemma4DecoderLayer(nn.Module):
    def __init__(self, config: Gemma4Config, spec: LayerSpec, backend: AttentionBackend) -> None:
        super().__init__()
        size, eps = config.hidden_size, config.rms_norm_eps
        self.input_layernorm = Float32RMSNorm(size, eps)
        self.self_attn = Gemma4Attention(config, spec, backend)
        self.post_attention_layernorm = Float32RMSNorm(size, eps)
        self.pre_feedforward_layernorm = Float32RMSNorm(size, eps)
        self.mlp = GatedMLP(size, spec.intermediate_size, activation=_gelu_tanh)
        self.post_feedforward_layernorm = Float32RMSNorm(size, eps)
        if config.per_layer_size:
            self.per_layer_input_gate = nn.Linear(size, config.per_layer_size, bias=False)
            self.per_layer_projection = nn.Linear(config.per_layer_size, size, bias=False)
            self.post_per_layer_input_norm = Float32RMSNorm(size, eps)
        self.layer_scalar = nn.Parameter(torch.ones(1))  # a buffer in HF; loaded from the checkpoint

    def forward(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv_cache: torch.Tensor,
                metadata: object, per_layer_input: torch.Tensor | None,
                shared: KeysValues | None) -> tuple[torch.Tensor, KeysValues]:
        attended, kv = self.self_attn(self.input_layernorm(hidden), cos, sin, kv_cache, metadata, shared)
        hidden = hidden + self.post_attention_layernorm(attended)
        hidden = hidden + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(hidden)))
        if per_layer_input is not None:
            gated = _gelu_tanh(self.per_layer_input_gate(hidden)) * per_layer_input
            hidden = hidden + self.post_per_layer_input_norm(self.per_layer_projection(gated))
        return hidden * self.layer_scalar, kv


class Gemma4Model(nn.Module):
    def __init__(self, config: Gemma4Config, backend: AttentionBackend) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size,
                                         _weight=torch.empty(config.vocab_size, config.hidden_size))
        self.layers = nn.ModuleList(Gemma4DecoderLayer(config, spec, backend) for spec in config.layers)
        self.norm = Float32RMSNorm(config.hidden_size, config.rms_norm_eps)
        local_dim = next((spec.head_dim for spec in config.layers if spec.window is not None), config.cache_head_dim)
        global_dim = next(spec.head_dim for spec in config.layers if spec.window is None)
        self.rotary_emb_local = ProportionalRotaryEmbedding(local_dim, config.max_positions, config.local_rope)
        self.rotary_emb = ProportionalRotaryEmbedding(global_dim, config.max_positions, config.global_rope)
        if config.per_layer_size:
            width = len(config.layers) * config.per_layer_size
            self.embed_tokens_per_layer = nn.Embedding(config.per_layer_vocab_size, width,
                                                       _weight=torch.empty(config.per_layer_vocab_size, width))
            self.per_layer_model_projection = nn.Linear(config.hidden_size, width, bias=False)
            self.per_layer_projection_norm = Float32RMSNorm(config.per_layer_size, config.rms_norm_eps)
        # sqrt(hidden_size) and sqrt(per_layer_size) in the weights' dtype (HF rounds the factor first);
        # set by build_buffers, so a CUDA graph's replay creates no tensor.
        self.register_buffer("embed_scale", torch.empty(()), persistent=False)
        self.register_buffer("per_layer_embed_scale", torch.empty(()), persistent=False)


class Gemma4ForCausalLM(nn.Module):
    """Serves Gemma4ForCausalLM checkpoints (dense)."""

    def __init__(self, config: Gemma4Config, backend: AttentionBackend) -> None:
        super().__init__()
        self.config = config
        self.model = Gemma4Model(config, backend)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.tie_weights()

    def tie_weights(self) -> None:
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def build_buffers(self, device: torch.device) -> None:
        """Both rotary tables and the embedding scales, once the weights are loaded."""
        self.model.rotary_emb.build(device)
        self.model.rotary_emb_local.build(device)
        dtype = self.model.embed_tokens.weight.dtype
        self.model.embed_scale = torch.tensor(self.config.hidden_size**0.5, device=device, dtype=dtype)
        self.model.per_layer_embed_scale = torch.tensor(self.config.per_layer_size**0.5, device=device, dtype=dtype)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, metadata: object,
                kv_caches: list[torch.Tensor]) -> torch.Tensor:
        """input_ids, positions [T] -> hidden states [T, hidden_size], final norm applied."""
        hidden = self.model.embed_tokens(input_ids) * self.model.embed_scale
        per_layer = self._per_layer_inputs(input_ids, hidden)
        global_rope = self.model.rotary_emb.lookup(positions, hidden.dtype)
        local_rope = self.model.rotary_emb_local.lookup(positions, hidden.dtype)
        reused = {layer.self_attn.spec.kv_source for layer in self.model.layers}
        produced: dict[int, KeysValues] = {}  # only the layers others reuse
        for index, (layer, kv_cache) in enumerate(zip(self.model.layers, kv_caches, strict=True)):
            spec = layer.self_attn.spec
            cos, sin = global_rope if spec.window is None else local_rope
            hidden, kv = layer(hidden, cos, sin, kv_cache, metadata,
                               per_layer[:, index] if per_layer is not None else None,
                               produced[spec.kv_source] if spec.kv_source is not None else None)
            if index in reused:
                produced[index] = kv
        return self.model.norm(hidden)

    def _per_layer_inputs(self, input_ids: torch.Tensor, embedded: torch.Tensor) -> torch.Tensor | None:
        """[T, layers, per_layer_size]: (norm(projected embedding) + per-layer token embedding) / sqrt(2)."""
        size = self.config.per_layer_size
        if not size:
            return None
        num_layers = len(self.model.layers)
        tokens = self.model.embed_tokens_per_layer(input_ids) * self.model.per_layer_embed_scale
        tokens = tokens.view(-1, num_layers, size)
        projected = self.model.per_layer_model_projection(embedded) * self.config.hidden_size**-0.5
        projected = self.model.per_layer_projection_norm(projected.view(-1, num_layers, size))
        return (projected + tokens) * 2.0**-0.5

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[R, hidden_size] -> float32 logits [R, vocab_size], soft-capped in the head's dtype as HF does."""
        logits = self.lm_head(hidden)
        cap = self.config.final_logit_softcap
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        return logits.float()

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy checkpoint tensors in (gate/up into the fused gate_up_proj); raise if any is missing."""
        params = dict(self.named_parameters(remove_duplicate=False))
        loaded: dict[str, int] = dict.fromkeys(params, 0)
        for name, tensor in weights:
            target_name, rows = self.locate(name)
            if target_name not in params:
                raise ValueError(f"unexpected weight in checkpoint: {name}")
            target = params[target_name].data[rows]
            if target.shape != tensor.shape:
                raise ValueError(f"weight {name} has shape {tuple(tensor.shape)}, expected {tuple(target.shape)}")
            with torch.no_grad():
                target.copy_(tensor)
            loaded[target_name] += tensor.numel()
        missing = {name for name, param in params.items() if loaded[name] < param.numel()}
        if self.config.tie_word_embeddings:
            missing.discard("lm_head.weight")
        if missing:
            raise ValueError(f"checkpoint is missing weights: {sorted(missing)[:8]}")

    def locate(self, name: str) -> tuple[str, slice]:
        """"model.layers.3.mlp.up_proj.weight" -> ("model.layers.3.mlp.gate_up_proj.weight", rows I..2I);
        also how a GGUF file's kept blocks find their linear (layers/quantize.py)."""
        module, _, kind = name.rpartition(".")
        prefix, _, proj = module.rpartition(".")
        if proj not in ("gate_proj", "up_proj"):
            return name, slice(None)
        size = self.config.layers[int(prefix.split(".")[2])].intermediate_size
        start = 0 if proj == "gate_proj" else size
        return f"{prefix}.gate_up_proj.{kind}", slice(start, start + size)

