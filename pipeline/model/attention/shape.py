"""AttentionShape: what the KV cache, the scheduler and the attention backend need of a model.

Sliding windows follow HF transformers: a layer with window W lets the query at position p see
keys at positions p - W + 1 .. p (`kv_idx > q_idx - W`), W keys including its own; a layer's
window may also be a Chunk (Llama 4's chunked local attention, windows.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pipeline.model.attention.windows import Chunk, Window, window_span


@dataclass(frozen=True, slots=True)
class AttentionShape:
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    scale: float  # multiplies q . k
    layer_windows: tuple[Window, ...]  # per layer; None = full attention (windows.py)
    logit_softcap: float | None = None  # scores -> softcap * tanh(scores / softcap) (Gemma 2)
    attention_sinks: bool = False  # layers pass learned sink logits to the backend (gpt-oss, sinks.py)
    # (FlexAttention serves them on CUDA only: selection.py)
    # Multi-head latent attention (DeepSeek-V2/V3, attention/latent.py): the cache holds one row of
    # head_dim values per token (num_kv_heads 1) whose first latent_dim values are the value; no V half.
    latent_dim: int | None = None

    def __post_init__(self) -> None:
        if len(self.layer_windows) != self.num_layers:
            raise ValueError(f"layer_windows has {len(self.layer_windows)} entries for {self.num_layers} layers")
        if any(isinstance(window, int) and window < 1 for window in self.layer_windows):
            raise ValueError(f"sliding windows must be >= 1, got {self.layer_windows}")
        if self.num_heads % self.num_kv_heads != 0:
            raise ValueError(f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})")
        if self.latent_dim is not None and (self.num_kv_heads != 1 or not 0 < self.latent_dim <= self.head_dim):
            raise ValueError(f"a latent cache has one KV head and 0 < latent_dim <= head_dim, got {self.num_kv_heads} "
                             f"heads, latent_dim {self.latent_dim}, head_dim {self.head_dim}")

    def cache_shape(self, num_blocks: int, block_size: int) -> tuple[int, ...]:
        """One layer's KV cache: [2 (K, V), blocks, block_size, kv heads, head_dim], or for a latent
        cache [blocks, block_size, 1, head_dim] (the value is a prefix of the key row)."""
        if self.latent_dim is not None:
            return (num_blocks, block_size, 1, self.head_dim)
        return (2, num_blocks, block_size, self.num_kv_heads, self.head_dim)

    @property
    def windows(self) -> frozenset[Window]:
        """The distinct windows of the layers (attention metadata is built once per window)."""
        return frozenset(self.layer_windows)

    @property
    def kv_window(self) -> int | None:
        """The window every layer stays inside (blocks older than it are never read again), or
        None when some layer attends to the whole context. A chunk of C positions stays inside a
        window of C (its first key is at most C - 1 positions back)."""
        spans = [window_span(window) for window in self.layer_windows]
        if any(span is None for span in spans):
            return None
        return max(span for span in spans if span is not None)


def layer_windows(config: dict[str, Any], num_layers: int) -> tuple[Window, ...]:
    """Per-layer sliding windows (or chunks) from an HF config.

    `layer_types` (transformers v5: Gemma 2, Qwen2 with use_sliding_window, Llama 4, ...) names each
    layer's kind; `chunked_attention` layers attend within chunks of `attention_chunk_size`
    (Llama 4). Without it a set `sliding_window` applies to every layer (Mistral, Phi-3,
    Mixtral). Qwen2/Qwen3 keep a `sliding_window` value even when `use_sliding_window` is off.
    """
    window = config.get("sliding_window")
    layer_types = config.get("layer_types")
    if layer_types is not None:
        return _typed_windows(layer_types, num_layers, window, config.get("attention_chunk_size"))
    if config.get("use_sliding_window") is False or not window:
        return (None,) * num_layers
    if config.get("use_sliding_window") and config.get("max_window_layers") is not None:
        # Old Qwen2 configs: layers from max_window_layers on use the window.
        first = int(config["max_window_layers"])
        return tuple(int(window) if index >= first else None for index in range(num_layers))
    return (int(window),) * num_layers


def _typed_windows(layer_types: list[str], num_layers: int, window: int | None,
                   chunk: int | None) -> tuple[Window, ...]:
    if len(layer_types) != num_layers:
        raise ValueError(f"layer_types has {len(layer_types)} entries for {num_layers} layers")
    unknown = set(layer_types) - {"full_attention", "sliding_attention", "chunked_attention"}
    if unknown:
        raise ValueError(f"layer types {sorted(unknown)} are not supported")
    if "sliding_attention" in layer_types and not window:
        raise ValueError("layer_types has sliding_attention layers but sliding_window is not set")
    if "chunked_attention" in layer_types and not chunk:
        raise ValueError("layer_types has chunked_attention layers but attention_chunk_size is not set")
    kinds: dict[str, Window] = {"full_attention": None, "sliding_attention": int(window or 0),
                                "chunked_attention": Chunk(int(chunk or 1))}
    return tuple(kinds[kind] for kind in layer_types)
