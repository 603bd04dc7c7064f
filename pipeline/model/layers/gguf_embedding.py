"""A token embedding kept in its GGUF file's blocks: each step looks up a few rows, so they are
decoded when asked for (csrc/gguf_linear.c's gguf_rows), each value what gguf-py dequantizes, instead
of holding the table dequantized (SmolLM2's 49152 x 576 float32 table is 113 MB; its Q8_0 blocks 30).
A tied model's embedding reads the output head's blocks: no byte is held twice.
"""

from __future__ import annotations

import torch
from torch import nn

from pipeline.model.layers.gguf_linear import GgufLinear


class GgufEmbedding(nn.Module):
    """nn.Embedding's lookup over a GgufLinear's weight rows, returned in `dtype`."""

    def __init__(self, table: GgufLinear, dtype: torch.dtype) -> None:
        super().__init__()
        self.table, self.dtype = table, dtype
        self.num_embeddings, self.embedding_dim = table.out_features, table.in_features

    @property
    def weight(self) -> torch.Tensor:
        """An empty tensor of the embedding's dtype and device: what callers ask `weight` for here
        (the table itself stays in blocks; `dequantized()` gives it)."""
        return torch.empty(0, dtype=self.dtype)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        ids = input_ids.reshape(-1)
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self.num_embeddings):
            raise IndexError(f"token id out of range for an embedding of {self.num_embeddings} rows")
        rows = self.table.kernel.rows(self.table.segments(), self.embedding_dim, ids)
        return rows.to(self.dtype).view(*input_ids.shape, self.embedding_dim)

    def dequantized(self) -> torch.Tensor:
        return self.table.dequantized().to(self.dtype)

    def resident_bytes(self) -> int:
        return self.table.resident_bytes()

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, qtypes={'+'.join(self.table.qtypes)}"
