"""Decoder-only transformer for the Llama family: Llama (incl. llama3 rope), Mistral, Qwen2, Qwen3;
Phi-3, Mixtral, Gemma 2, Gemma 3, OLMo 2, Granite, SmolLM3, GLM-4, Qwen3-MoE, Qwen2-MoE and gpt-oss (each in
its own module) build on it.

The families differ only in flags: qkv bias (Qwen2), per-head q/k RMSNorm (Qwen3), an explicit
head_dim (Qwen3), tied embeddings, sliding-window layers (Mistral; Qwen2 with use_sliding_window),
a mixture-of-experts MLP (Mixtral). Module names mirror HF checkpoints except two fusions:
q/k/v_proj -> qkv_proj and gate/up_proj -> gate_up_proj (fewer, larger matmuls); `load_weights`
maps checkpoint names onto them (Phi-3 checkpoints store them fused already).

Tokens are flat ([T], no batch axis); attention metadata says which tokens belong together.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from pipeline.model.attention.paged import AttentionBackend
from pipeline.model.attention.shape import AttentionShape, layer_windows
from pipeline.model.attention.windows import Window
from pipeline.model.layers.mlp import GatedMLP
from pipeline.model.layers.moe import SparseMoE
from pipeline.model.layers.norms import RMSNorm
from pipeline.model.layers.rope import RopeParams, RotaryEmbedding, apply_rotary, parse_rope

# A parameter's part that one checkpoint tensor fills: rows of a fused matrix, or (expert, rows).
Index = slice | tuple[int, slice]


@dataclass(frozen=True, slots=True)
class DecoderConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope: RopeParams
    max_positions: int  # rows of the rotary table
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    tie_word_embeddings: bool = False
    layer_windows: tuple[Window, ...] = ()  # per layer (empty = all full attention; attention/windows.py)
    num_experts: int = 0  # > 0: each MLP is a mixture of this many experts (intermediate_size each)
    num_experts_per_tok: int = 0

    def window_of(self, layer_index: int) -> Window:
        return self.layer_windows[layer_index] if self.layer_windows else None


def decoder_config(config: dict[str, Any], max_positions: int) -> DecoderConfig:
    """DecoderConfig from an HF config.json dict of any architecture this module serves."""
    architecture = config["architectures"][0]
    num_heads = config["num_attention_heads"]
    attention_bias = bool(config.get("attention_bias", False))
    is_qwen2 = architecture in ("Qwen2ForCausalLM", "Qwen2Model")
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
        qkv_bias=True if is_qwen2 else attention_bias,
        o_bias=False if is_qwen2 else attention_bias,
        mlp_bias=bool(config.get("mlp_bias", False)),
        qk_norm=architecture in ("Qwen3ForCausalLM", "Qwen3Model"),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        layer_windows=layer_windows(config, config["num_hidden_layers"]),
    )


def attention_shape(config: dict[str, Any]) -> AttentionShape:
    decoder = decoder_config(config, max_positions=1)
    return AttentionShape(num_layers=decoder.num_layers, num_heads=decoder.num_heads,
                          num_kv_heads=decoder.num_kv_heads, head_dim=decoder.head_dim,
                          scale=decoder.head_dim**-0.5, layer_windows=decoder.layer_windows)


def build_model(config: dict[str, Any], backend: AttentionBackend, max_positions: int) -> LlamaForCausalLM:
    return LlamaForCausalLM(decoder_config(config, max_positions), backend)


class Attention(nn.Module):
    def __init__(self, config: DecoderConfig, backend: AttentionBackend, window: Window = None) -> None:
        super().__init__()
        self.window = window
        self.num_heads, self.num_kv_heads = config.num_heads, config.num_kv_heads
        self.head_dim = config.head_dim
        self.q_size = config.num_heads * config.head_dim
        self.kv_size = config.num_kv_heads * config.head_dim
        self.qkv_proj = nn.Linear(config.hidden_size, self.q_size + 2 * self.kv_size, bias=config.qkv_bias)
        self.o_proj = nn.Linear(self.q_size, config.hidden_size, bias=config.o_bias)
        self.q_norm = RMSNorm(config.head_dim, config.rms_norm_eps) if config.qk_norm else None
        self.k_norm = RMSNorm(config.head_dim, config.rms_norm_eps) if config.qk_norm else None
        self.backend = backend

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv_cache: torch.Tensor,
                metadata: object) -> torch.Tensor:
        num_tokens = x.shape[0]
        qkv = self.qkv_proj(x)
        v = qkv[:, self.q_size + self.kv_size:].view(num_tokens, self.num_kv_heads, self.head_dim)
        if self.q_norm is None and self._rope_and_write_kv(qkv, cos, sin, kv_cache, metadata):
            q = qkv[:, :self.q_size].view(num_tokens, self.num_heads, self.head_dim)
            k = qkv[:, self.q_size:self.q_size + self.kv_size].view(num_tokens, self.num_kv_heads, self.head_dim)
            out = self.attend(q, k, v, kv_cache, metadata, kv_written=True)
            return self.o_proj(out.reshape(num_tokens, self.q_size))
        if self.q_norm is not None and self.k_norm is not None:
            q, k = qkv[:, :self.q_size + self.kv_size].split([self.q_size, self.kv_size], dim=-1)
            q = apply_rotary(self.q_norm(q.view(num_tokens, self.num_heads, self.head_dim)), cos, sin)
            k = apply_rotary(self.k_norm(k.view(num_tokens, self.num_kv_heads, self.head_dim)), cos, sin)
        else:
            # q and k heads side by side in each qkv row, rotated in one pass (half the small ops).
            qk = apply_rotary(qkv[:, :self.q_size + self.kv_size].view(
                num_tokens, self.num_heads + self.num_kv_heads, self.head_dim), cos, sin)
            q, k = qk.split([self.num_heads, self.num_kv_heads], dim=1)
        out = self.attend(q, k, v, kv_cache, metadata)
        return self.o_proj(out.reshape(num_tokens, self.q_size))

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor, metadata: object,
               **options: Any) -> torch.Tensor:
        """The backend's attention over this layer's window (gpt-oss adds its sinks to the options)."""
        return self.backend.forward(q, k, v, kv_cache, metadata, window=self.window, **options)

    def _rope_and_write_kv(self, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv_cache: torch.Tensor,
                           metadata: object) -> bool:
        """The native rope + KV write (one call instead of ~16 small ops), when the backend has it."""
        fused = getattr(self.backend, "rope_and_write_kv", None)
        return fused is not None and fused(qkv, cos, sin, kv_cache, metadata, self.num_heads)


class DecoderLayer(nn.Module):
    attention_class: ClassVar[type[Attention]] = Attention  # families with other attention (SmolLM3) pass theirs

    def __init__(self, config: DecoderConfig, backend: AttentionBackend, window: Window = None) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = self.attention_class(config, backend, window)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp: nn.Module
        if config.num_experts:
            self.mlp = SparseMoE(config.hidden_size, config.intermediate_size, config.num_experts,
                                 config.num_experts_per_tok)
        else:
            self.mlp = GatedMLP(config.hidden_size, config.intermediate_size, bias=config.mlp_bias)

    def forward(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv_cache: torch.Tensor,
                metadata: object) -> torch.Tensor:
        hidden = hidden + self.self_attn(self.input_layernorm(hidden), cos, sin, kv_cache, metadata)
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class DecoderModel(nn.Module):
    """Embeddings, the layer stack, the final norm and the rotary table; families with other
    layers or norms (Gemma 2) pass their classes."""

    layer_class: ClassVar[type[nn.Module]] = DecoderLayer
    norm_class: ClassVar[type[nn.Module]] = RMSNorm

    def __init__(self, config: DecoderConfig, backend: AttentionBackend) -> None:
        super().__init__()
        # An explicit (uninitialised) weight skips nn.Embedding's random init: the checkpoint
        # overwrites it anyway, and torch's normal_ imports torch._dynamo on first use (~1 s).
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size,
                                         _weight=torch.empty(config.vocab_size, config.hidden_size))
        self.layers = nn.ModuleList(self.layer_class(config, backend, config.window_of(index))
                                    for index in range(config.num_layers))
        self.norm = self.norm_class(config.hidden_size, config.rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(config.head_dim, config.max_positions, config.rope)


class LlamaForCausalLM(nn.Module):
    """Serves Llama, Mistral, Qwen2, Qwen3 and Phi-3 checkpoints; the base of Mixtral's model.

    Families with the same checkpoint layout but other layers (Gemma 2) subclass it with their own
    `decoder_class`, and inherit the weight loading.
    """

    decoder_class: ClassVar[type[nn.Module]] = DecoderModel
    # checkpoint suffix -> (fused parameter suffix, shard index)
    _FUSED: ClassVar[dict[str, tuple[str, int]]] = {
        "q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2),
        "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1),
    }

    def __init__(self, config: DecoderConfig, backend: AttentionBackend) -> None:
        super().__init__()
        self.config = config
        self.model = self.decoder_class(config, backend)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.tie_weights()
        # Decode steps' layers in one native call (native_decode.NativeDecoder; the runner sets it
        # where it applies): (hidden, cos, sin, metadata, kv_caches) -> hidden, or None for this step.
        self.native_decoder: Callable[..., torch.Tensor | None] | None = None

    def tie_weights(self) -> None:
        """Share embed_tokens' weight with lm_head (again after materialising from meta)."""
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def build_buffers(self, device: torch.device) -> None:
        """Compute the non-persistent buffers (the rotary table) once the weights are loaded."""
        self.model.rotary_emb.build(device)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, metadata: object,
                kv_caches: list[torch.Tensor]) -> torch.Tensor:
        """input_ids, positions [T] -> hidden states [T, hidden_size], final norm applied."""
        return self.forward_embeddings(self.model.embed_tokens(input_ids), positions, metadata, kv_caches)

    def forward_embeddings(self, hidden: torch.Tensor, positions: torch.Tensor, metadata: object,
                           kv_caches: list[torch.Tensor]) -> torch.Tensor:
        """Token embeddings [T, hidden_size] (a vision model's images merged in) -> final hidden states."""
        cos, sin = self.model.rotary_emb.lookup(positions, hidden.dtype)  # shared by every layer
        if self.native_decoder is not None:
            native = self.native_decoder(hidden, cos, sin, metadata, kv_caches)
            if native is not None:
                return self.model.norm(native)
        for layer, kv_cache in zip(self.model.layers, kv_caches, strict=True):
            hidden = layer(hidden, cos, sin, kv_cache, metadata)
        return self.model.norm(hidden)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[R, hidden_size] -> float32 logits [R, vocab_size]."""
        # Native heads write float32 themselves: a separate .float() of 49k logits per row cost ~100 us
        # on 2 threads, mostly waking a sleeping OpenMP thread.
        widened = getattr(self.lm_head, "forward_float32", None)
        logits = widened(hidden) if widened is not None else None
        return logits if logits is not None else self.lm_head(hidden).float()

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy checkpoint tensors into the (possibly fused) parameters; raise if any part is missing."""
        # Old checkpoints store the rope table; it is recomputed.
        kept = ((name, tensor) for name, tensor in weights if "rotary_emb.inv_freq" not in name)
        copy_weights_in(self, kept, lambda name: self.locate(_with_model_prefix(name)), self.config.tie_word_embeddings)

    def locate(self, name: str) -> tuple[str, Index]:
        """The parameter a checkpoint tensor belongs to, and which part of it.

        "model.layers.0.self_attn.k_proj.weight" -> ("model.layers.0.self_attn.qkv_proj.weight", rows q..q+kv)
        """
        module, _, kind = name.rpartition(".")
        prefix, _, proj = module.rpartition(".")
        if proj not in self._FUSED:
            return name, slice(None)
        fused, shard = self._FUSED[proj]
        sizes = self._shard_sizes(fused)
        start = sum(sizes[:shard])
        return f"{prefix}.{fused}.{kind}", slice(start, start + sizes[shard])

    def _shard_sizes(self, fused: str) -> list[int]:
        c = self.config
        if fused == "qkv_proj":
            return [c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim, c.num_kv_heads * c.head_dim]
        return [c.intermediate_size, c.intermediate_size]


_BASE_MODEL_PARTS = ("layers.", "embed_tokens.", "norm.")


def copy_weights_in(model: nn.Module, weights: Iterable[tuple[str, torch.Tensor]],
                    locate: Callable[[str], tuple[str, Index]], tie_word_embeddings: bool) -> None:
    """Copy checkpoint tensors into `model`'s (possibly fused) parameters, each where `locate` puts its name;
    raise on a name no parameter takes, a shape that does not fit, or a part missing. A checkpoint without
    lm_head has the embeddings double as the head (`model` has `lm_head` and `model.embed_tokens`)."""
    params = dict(model.named_parameters(remove_duplicate=False))
    # Elements written per parameter: a fused parameter is complete once its shards add up to it.
    loaded = dict.fromkeys(params, 0)
    for name, tensor in weights:
        param_name, index = locate(name)
        if param_name not in params:
            raise ValueError(f"unexpected weight in checkpoint: {name}")
        target = params[param_name].data[index]
        if target.shape != tensor.shape:
            raise ValueError(f"weight {name} has shape {tuple(tensor.shape)}, expected {tuple(target.shape)}")
        with torch.no_grad():
            target.copy_(tensor)
        loaded[param_name] += tensor.numel()
    missing = {name for name, param in params.items() if loaded[name] < param.numel()}
    if tie_word_embeddings:
        missing.discard("lm_head.weight")
    if "lm_head.weight" in missing and "model.embed_tokens.weight" not in missing:
        model.lm_head.weight = model.model.embed_tokens.weight
        missing.discard("lm_head.weight")
    if missing:
        raise ValueError(f"checkpoint is missing weights: {sorted(missing)[:8]}")


def _with_model_prefix(name: str) -> str:
    """A base model's checkpoint (Qwen3Model, MistralModel: an embedder's) names its parts without `model.`."""
    return f"model.{name}" if name.startswith(_BASE_MODEL_PARTS) else name
