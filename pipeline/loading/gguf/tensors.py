"""GGUF tensors -> HF-named, dequantized torch tensors.

GGUF lists a tensor's shape in ggml's order (fastest-varying dimension first), the reverse of
numpy's; the reader's `data` is already in numpy order, so after dequantizing, the HF shape is
`reversed(tensor.shape)`. This is checked for every tensor, as is every name: a tensor we cannot
place is an error, never silently dropped. What convert_hf_to_gguf.py changed is undone: the Q/K
row permutation of llama files, the +1 on Gemma norm weights, the stacking of experts (split per
expert where HF saves them so); what a converter split or transposed is joined in joins.py.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import numpy as np
import torch
from gguf import GGUFReader, ReaderTensor
from gguf.quants import dequantize

from pipeline.loading.gguf.architectures import GgufArchitecture

ROPE_FREQS = "rope_freqs.weight"  # not a weight: folded into config.json's rope_scaling
_EXPERT = "{expert}"
_NAME = re.compile(r"(?:blk\.(?P<layer>\d+)\.)?(?P<base>[a-z_0-9]+)\.(?P<kind>weight|bias)")


def hf_tensor_name(name: str, arch: GgufArchitecture) -> str:
    """`blk.3.attn_q.weight` -> `model.layers.3.self_attn.q_proj.weight`; ValueError when unknown."""
    match = _NAME.fullmatch(name)
    if match is not None:
        layer, base, kind = match["layer"], match["base"], match["kind"]
        layer_tensors = arch.layer_tensors()
        if layer is not None and f"{base}.{kind}" in layer_tensors:  # named whole: "attn_sinks.weight"
            return f"model.layers.{layer}.{layer_tensors[f'{base}.{kind}']}"
        if layer is not None and base in layer_tensors:
            return f"model.layers.{layer}.{layer_tensors[base]}.{kind}"
        if layer is None and base in (global_tensors := arch.global_tensors()):
            return f"{global_tensors[base]}.{kind}"
    raise ValueError(f"GGUF tensor {name!r} has no HF counterpart for {arch.hf_architecture}")


def dequantized(tensor: ReaderTensor) -> np.ndarray:
    """float32, in numpy (HF) dimension order."""
    array = np.asarray(dequantize(tensor.data, tensor.tensor_type), dtype=np.float32)
    if not array.flags.writeable:  # float32 tensors come back as views of the read-only file mapping
        array = array.copy()
    expected = tuple(int(n) for n in reversed(tensor.shape))
    if array.shape != expected:
        raise ValueError(f"GGUF tensor {tensor.name!r}: dequantized to {array.shape}, header says {expected}")
    return array


def unpermute_qk(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Undo convert_hf_to_gguf.py's LlamaModel.permute on Q or K rows (weights and biases).

    Per head, HF keeps the two rotary halves apart ([x0..x(d/2-1), y0..]) and llama.cpp interleaves
    the pairs ([x0, y0, x1, y1, ...]); llama.cpp's permute views a head's rows as (2, d/2) and
    transposes, so the inverse views them as (d/2, 2) and transposes back.
    """
    rows = weight.shape[0]
    per_head = weight.reshape(num_heads, rows // num_heads // 2, 2, *weight.shape[1:])
    return per_head.swapaxes(1, 2).reshape(weight.shape)


def per_expert(name: str, array: np.ndarray) -> Iterator[tuple[str, np.ndarray]]:
    """A stacked [experts, out, in] tensor as HF's one matrix per expert; any other tensor as it is.

    ("...experts.{expert}.w1.weight", [4, I, H]) -> ("...experts.0.w1.weight", [I, H]), ... ("...experts.3...", ...)
    """
    if _EXPERT not in name:
        yield name, array
        return
    if array.ndim != 3:
        raise ValueError(f"{name.replace(_EXPERT, '*')}: expected experts stacked as [experts, out, in], "
                         f"got shape {array.shape}")
    for expert, matrix in enumerate(array):
        yield name.replace(_EXPERT, str(expert)), matrix


def iter_hf_tensors(reader: GGUFReader, arch: GgufArchitecture, num_heads: int, num_kv_heads: int,
                    dtype: torch.dtype) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, tensor in `dtype`) for every weight of the file, one GGUF tensor at a time."""
    for tensor in reader.tensors:
        if tensor.name == ROPE_FREQS:
            continue
        name = hf_tensor_name(tensor.name, arch)
        array = dequantized(tensor)
        if arch.permuted_qk and ".self_attn.q_proj." in name:
            array = unpermute_qk(array, num_heads)
        elif arch.permuted_qk and ".self_attn.k_proj." in name:
            array = unpermute_qk(array, num_kv_heads)
        elif arch.norm_weight_offset and name.endswith("norm.weight"):
            array = array - np.float32(arch.norm_weight_offset)  # in float32, before any cast to a narrower dtype
        for hf_name, part in per_expert(name, array):
            yield hf_name, torch.from_numpy(np.ascontiguousarray(part)).to(dtype)


def rope_freqs(reader: GGUFReader) -> np.ndarray | None:
    for tensor in reader.tensors:
        if tensor.name == ROPE_FREQS:
            return dequantized(tensor)
    return None
