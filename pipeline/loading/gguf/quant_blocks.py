"""GGUF's quantized blocks kept as they are: written beside the dequantized checkpoint, read back
as 4-bit values with a scale and zero per group of 32 (Q4_0/Q4_1: pipeline/model/layers/quantized_linear.py)
or as the raw rows (Q5_0, Q8_0, Q4_K, Q5_K, Q6_K: pipeline/model/layers/gguf_linear.py, whose C
decoder, csrc/gguf_blocks.h, documents those layouts).

`gguf_blocks.safetensors` in a converted directory holds, under each HF weight name, the raw
rows of that weight in those types (uint8 [rows, bytes per row], Q/K rows already un-permuted, as in
the dequantized file: a row's blocks move whole), and in its metadata every weight's GGUF type
({"qtypes": {name: "Q4_1", ...}}), so the loader also knows which float weights came from other
quantized types.

Block layouts (ggml), 32 weights each, fp16 d and m:
    Q4_0: d, 16 bytes of nibbles            w = d * (q - 8)
    Q4_1: d, m, 16 bytes of nibbles         w = d * q + m
Byte j of the nibbles holds weight j in its low half and weight j + 16 in its high half.
Worked example (Q4_1): d = 0.5, m = -1, byte 0 = 0x3A -> weight 0 = 0.5 * 10 - 1 = 4, weight 16 =
0.5 * 3 - 1 = 0.5.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType, GGUFReader
from safetensors import safe_open
from safetensors.torch import save_file

from pipeline.loading.gguf.architectures import GgufArchitecture
from pipeline.loading.gguf.joins import joined_name
from pipeline.loading.gguf.tensors import ROPE_FREQS, hf_tensor_name, per_expert, unpermute_qk

BLOCKS_FILE = "gguf_blocks.safetensors"
KEPT_TYPES = {"Q4_0": 18, "Q4_1": 20}  # block bytes of the 4-bit types, read back decoded (decode_q4)
RAW_TYPES = frozenset({*KEPT_TYPES, "Q5_0", "Q8_0", "Q4_K", "Q5_K", "Q6_K"})  # all whose rows are kept
BLOCK = 32


def iter_hf_blocks(reader: GGUFReader, arch: GgufArchitecture, num_heads: int,
                   num_kv_heads: int) -> Iterator[tuple[str, str, np.ndarray | None]]:
    """(HF name, GGUF type name, raw rows or None) for every weight; rows only for RAW_TYPES. A tensor
    rebuilt from parts (joins.py) is named once, with its first part's type, and keeps no rows."""
    joined: dict[str, str] = {}
    for tensor in reader.tensors:
        if tensor.name == ROPE_FREQS:
            continue
        name = hf_tensor_name(tensor.name, arch)
        qtype = GGMLQuantizationType(tensor.tensor_type).name
        if (target := joined_name(arch.joins, name)) is not None:
            joined.setdefault(target, qtype)
            continue
        kept = qtype in RAW_TYPES
        raw = np.asarray(tensor.data)  # a view of the file mapping: only kept types are copied
        if kept and arch.permuted_qk and ".self_attn.q_proj." in name:
            raw = unpermute_qk(raw, num_heads)
        elif kept and arch.permuted_qk and ".self_attn.k_proj." in name:
            raw = unpermute_qk(raw, num_kv_heads)
        for hf_name, part in per_expert(name, raw):
            yield hf_name, qtype, part if kept else None
    for target, qtype in joined.items():
        yield target, qtype, None


def write_blocks(reader: GGUFReader, arch: GgufArchitecture, num_heads: int, num_kv_heads: int,
                 out_dir: Path) -> None:
    qtypes: dict[str, str] = {}
    kept: dict[str, torch.Tensor] = {}
    for name, qtype, raw in iter_hf_blocks(reader, arch, num_heads, num_kv_heads):
        qtypes[name] = qtype
        if raw is not None:
            kept[name] = torch.from_numpy(np.array(raw, dtype=np.uint8))  # a copy: the mapping is read-only
    save_file(kept, str(out_dir / BLOCKS_FILE), metadata={"qtypes": json.dumps(qtypes)})
    (out_dir / BLOCKS_FILE).chmod(0o644)


class GgufBlocks:
    """The blocks file of a converted directory: types of all weights, blocks of the kept ones."""

    def __init__(self, model_dir: str | Path) -> None:
        path = Path(model_dir) / BLOCKS_FILE
        if not path.is_file():
            raise ValueError(f"quantization 'gguf' needs a model converted from a GGUF file; {model_dir} has no "
                             f"{BLOCKS_FILE} (an HF checkpoint: use quantization 'int8')")
        self._file = safe_open(str(path), framework="pt", device="cpu")
        self.qtypes: dict[str, str] = json.loads(self._file.metadata()["qtypes"])

    def raw(self, name: str) -> torch.Tensor:
        """Weight `name`'s rows as the file stores them, uint8 [rows, bytes per row]."""
        return self._file.get_tensor(name)

    def decoded(self, name: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Weight `name` as (values [rows, K] uint8 0..15, scales, zeros [rows, K / 32] float32),
        with w = (value - 8) * scale + zero."""
        return decode_q4(self._file.get_tensor(name).numpy(), self.qtypes[name])


def decode_q4(raw: np.ndarray, qtype: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Raw Q4_0/Q4_1 rows [rows, blocks * block bytes] -> (values, scales, zeros); see module doc."""
    block_bytes = KEPT_TYPES[qtype]
    rows = raw.shape[0]
    blocks = raw.reshape(rows, -1, block_bytes)  # [rows, G, bytes]
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    nibbles = blocks[..., block_bytes - 16:]
    values = np.concatenate([nibbles & 0x0F, nibbles >> 4], axis=-1).reshape(rows, -1)  # [rows, G * 32]
    if qtype == "Q4_0":
        zeros = np.zeros_like(d)
    else:
        m = blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
        zeros = m + 8.0 * d
    return torch.from_numpy(values), torch.from_numpy(d), torch.from_numpy(zeros)
