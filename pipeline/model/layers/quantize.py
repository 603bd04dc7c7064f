"""Swap a loaded model's nn.Linear layers for weight-only quantized ones (quantized_linear.py).

- "int8": every linear, quantized per output channel from its loaded weight.
- "gguf": each linear as its GGUF file stored it. Weights whose every part (a fused qkv_proj has
  three) was Q4_0/Q4_1 take those blocks as they are (Int4Linear, no requantization); with the
  native kernel, weights whose parts are all Q5_0, Q8_0, Q4_K, Q5_K, Q6_K (or those mixed with
  Q4_0/Q4_1) keep their blocks too (GgufLinear: column blocks where the CPU has AVX-512, about the
  file's bytes; else the file's rows); weights from any other quantized
  type (IQ-quants, Q2_K, Q3_K, ...), or any quantized weight without the native kernel, become
  per-channel int8 from their dequantized values; weights stored as F32/F16/BF16 stay float. A tied
  lm_head follows the embedding's type; an embedding of a type GgufLinear holds stays in its blocks,
  rows decoded when looked up (gguf_embedding.py; a tied one reads the head's), others dequantized.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import structlog
import torch
from torch import nn

from pipeline.loading.gguf.quant_blocks import BLOCKS_FILE, KEPT_TYPES, GgufBlocks
from pipeline.model.cpu.gguf_kernel import GgufLinearKernel, load_gguf_linear_kernel
from pipeline.model.cpu.kernels import QuantizedLinearKernel
from pipeline.model.layers.gguf_embedding import GgufEmbedding
from pipeline.model.layers.gguf_linear import GGUF_KERNEL_TYPES, GgufLinear
from pipeline.model.layers.packed_cache import Packed, load_packed, save_packed
from pipeline.model.layers.quantized_linear import Int4Linear, Int8Linear

log = structlog.get_logger(__name__)

_FLOAT_TYPES = ("F32", "F16", "BF16")


def auto_quantization(model_dir: str | Path, on_cpu: bool, tp_world: int, kernels_work: bool) -> str:
    """quantization "auto": a model converted from a GGUF file keeps its quantized weights (gguf) where
    they can run (the CPU, one rank, a quantized kernel); anything else computes as stored (none)."""
    from_gguf = (Path(model_dir) / BLOCKS_FILE).exists()
    return "gguf" if from_gguf and on_cpu and tp_world == 1 and kernels_work else "none"


def quantize_linears(model: nn.Module, mode: str, model_dir: str | Path,
                     native: QuantizedLinearKernel | None = None) -> dict[str, int]:
    """Replace linears in place; returns how many of each kind were made. native: run them through
    our kernel (quantized_linear.py), else through torch's."""
    if mode == "int8":
        counts = {"int8": _replace(model, lambda _name, linear: Int8Linear.from_float(linear.weight, linear.bias,
                                                                                       native))}
    elif mode == "gguf":
        counts = _quantize_from_gguf(model, GgufBlocks(model_dir), native, model_dir)
    else:
        raise ValueError(f"quantization must be 'gguf' or 'int8' here, got {mode!r}")
    log.info("linear layers quantized", mode=mode, kernel="native" if native is not None else "torch", **counts)
    return counts


def _replace(model: nn.Module, make: Callable[[str, nn.Linear], nn.Module | None]) -> int:
    replaced = 0
    for parent_name, parent in list(model.named_modules()):
        for name, child in list(parent.named_children()):
            if type(child) is not nn.Linear:
                continue
            new = make(f"{parent_name}.{name}" if parent_name else name, child)
            if new is not None:
                setattr(parent, name, new)
                replaced += 1
    return replaced


def _quantize_from_gguf(model: nn.Module, blocks: GgufBlocks, native: QuantizedLinearKernel | None,
                        model_dir: str | Path) -> dict[str, int]:
    sources = _weight_sources(model, blocks)
    counts = {"int4": 0, "gguf_blocks": 0, "int8": 0}
    gguf_kernel = load_gguf_linear_kernel() if native is not None else None
    cached = load_packed(model_dir) if native is not None else {}  # native layers packed by an earlier start
    packed: Packed = {}
    held_as: dict[str, set[str]] = defaultdict(set)  # GGUF type -> how its weights are held (for the log)

    def cached_or(name: str, linear: nn.Linear, cls: type[Int4Linear] | type[Int8Linear],
                  made: Callable[[], Int4Linear | Int8Linear]) -> nn.Module:
        """The native layer from the packed cache when it holds one of this shape, else `made()`;
        native layers are kept for the cache."""
        entry = cached.get(name)
        fits = entry is not None and entry.get("shape", torch.tensor([])).tolist() == [linear.out_features,
                                                                                        linear.in_features]
        layer = cls.from_packed(entry, linear.bias, native) if native is not None and fits else made()
        if native is not None:
            packed[name] = layer.packed_buffers()
        return layer

    def make(name: str, linear: nn.Linear) -> nn.Module | None:
        parts = sources.get(f"{name}.weight", [])
        if not parts:
            return None
        qtypes = [blocks.qtypes[source] for _, source in parts]
        if all(qtype in KEPT_TYPES for qtype in qtypes):
            counts["int4"] += 1
            _note(held_as, qtypes, "4-bit column blocks")
            return cached_or(name, linear, Int4Linear,
                             lambda: Int4Linear(*_int4(blocks, parts), linear.bias, native))
        if gguf_kernel is not None and _keeps_blocks(name, qtypes, gguf_kernel):
            counts["gguf_blocks"] += 1
            layer = GgufLinear([(qtype, blocks.raw(source)) for qtype, (_, source) in zip(qtypes, parts, strict=True)],
                               linear.in_features, linear.bias, gguf_kernel)
            for qtype, columns in zip(qtypes, layer.column_parts, strict=True):
                _note(held_as, [qtype], "column blocks, integer products" if columns else "file blocks, float products")
            return layer
        if any(qtype not in _FLOAT_TYPES for qtype in qtypes):
            counts["int8"] += 1
            _note(held_as, qtypes, "dequantized, int8 per channel")
            return cached_or(name, linear, Int8Linear,
                             lambda: Int8Linear.from_float(linear.weight, linear.bias, native))
        return None

    _replace(model, make)
    embedding = _gguf_embedding(model, blocks, sources, gguf_kernel) if gguf_kernel is not None else None
    if embedding is not None:
        model.model.embed_tokens = embedding
        counts["gguf_embedding"] = 1
        _note(held_as, embedding.table.qtypes, "embedding rows decoded when looked up")
    for qtype, ways in sorted(held_as.items()):
        log.info("GGUF weights held", qtype=qtype, held_as=", ".join(sorted(ways)))
    fresh = [name for name, buffers in packed.items()  # packed now, not read from the cache
             if buffers["column_blocks"] is not cached.get(name, {}).get("column_blocks")]
    if native is not None and (fresh or packed.keys() != cached.keys()):
        save_packed(model_dir, packed)
    return counts


def _gguf_embedding(model: nn.Module, blocks: GgufBlocks, sources: dict[str, list[tuple[int, str]]],
                    kernel: GgufLinearKernel) -> GgufEmbedding | None:
    """model.model.embed_tokens kept in its file's blocks (gguf_embedding.py) when every part of it is
    of a type GgufLinear holds; a tied head's layer is shared, not held twice."""
    embed = getattr(getattr(model, "model", None), "embed_tokens", None)
    parts = sources.get("model.embed_tokens.weight", [])
    qtypes = [blocks.qtypes[source] for _, source in parts]
    if type(embed) is not nn.Embedding or not parts or not all(qtype in GGUF_KERNEL_TYPES for qtype in qtypes):
        return None
    head = getattr(model, "lm_head", None)
    if isinstance(head, GgufLinear) and sources.get("lm_head.weight") == parts:
        table = head
    else:
        table = GgufLinear([(qtype, blocks.raw(source)) for qtype, (_, source) in zip(qtypes, parts, strict=True)],
                           embed.embedding_dim, None, kernel)
    return GgufEmbedding(table, embed.weight.dtype)


def _note(held_as: dict[str, set[str]], qtypes: list[str], how: str) -> None:
    """Record how a weight's quantized parts are held; a float part is not a GGUF type to report."""
    for qtype in qtypes:
        if qtype not in _FLOAT_TYPES:
            held_as[qtype].add(how)


def _int4(blocks: GgufBlocks, parts: list[tuple[int, str]]) -> tuple[torch.Tensor, ...]:
    """A weight's Q4_0/Q4_1 parts as (values, scales, zeros), rows in order."""
    decoded = [blocks.decoded(source) for _, source in parts]
    return tuple(torch.cat([part[i] for part in decoded]) for i in range(3))


def _keeps_blocks(name: str, qtypes: list[str], kernel: GgufLinearKernel) -> bool:
    """Whether GgufLinear takes this weight. Where column blocks are not fast (no AVX-512), a Q8_0
    output head (the largest matrix of a small model: SmolLM2's is 49152 x 576) runs on the int8
    kernel instead, 1.2-1.7 ms a step there against 3.3-3.7 ms as the file's rows on a 2-core Zen 4,
    its logits moved by int8's per-channel rounding (docs/cli.md#gguf-k-quants); as column blocks it
    takes what the int8 kernel takes (1.2-1.3 ms on a 2-core Xeon VM) with the file's values."""
    if name == "lm_head" and set(qtypes) == {"Q8_0"} and not kernel.columns_fast:
        return False
    return all(qtype in GGUF_KERNEL_TYPES for qtype in qtypes)


def _weight_sources(model: nn.Module, blocks: GgufBlocks) -> dict[str, list[tuple[int, str]]]:
    """Parameter name -> [(first row, checkpoint name)] in row order, for the weights of 2-D tensors.

    "model.layers.0.self_attn.qkv_proj.weight" -> [(0, "...q_proj.weight"), (576, "...k_proj.weight"),
    (768, "...v_proj.weight")]. An expert's weight (a (expert, rows) index) is left out: its layer is
    not an nn.Linear.
    """
    locate = getattr(model, "locate", None)
    if locate is None:
        raise ValueError(f"quantization 'gguf' is not supported for {type(model).__name__}")
    sources: dict[str, list[tuple[int, str]]] = defaultdict(list)
    for name in blocks.qtypes:
        if not name.endswith(".weight"):
            continue
        param_name, index = locate(name)
        if isinstance(index, slice):
            sources[param_name].append((index.start or 0, name))
    lm_head = getattr(model, "lm_head", None)
    embed = "model.embed_tokens.weight"
    if lm_head is not None and "lm_head.weight" not in sources and embed in sources:
        sources["lm_head.weight"] = list(sources[embed])  # tied, or no head in the file: the embedding
    return {name: sorted(parts) for name, parts in sources.items()}
