"""Attention sinks (gpt-oss): a learned logit per query head that joins every softmax denominator but
carries no value, so a head can give part of its weight to nothing:

    out = sum_j exp(s_j) v_j / (sum_j exp(s_j) + exp(sink))

The torch backend (paged.py) computes it as HF's eager attention does: the sink appended as one more
score column, the row's max subtracted, the softmax in the scores' dtype, the column dropped. A
backend whose kernel returns the log-sum-exp of the scores (FlexAttention, flex.py) rescales its
output instead: with Z = sum_j exp(s_j), out_sink = out * Z / (Z + exp(sink)) = out * sigmoid(lse - sink).
The native CPU decode kernel (cpu/csrc/paged_decode_attention.c) adds the sink to each head's max and
denominator in float32.
"""

from __future__ import annotations

import torch


def sink_softmax(scores: torch.Tensor, sinks: torch.Tensor) -> torch.Tensor:
    """scores [B, H, Q, L] (masked entries -inf), sinks broadcastable to [B, H, Q, 1] -> attention
    weights [B, H, Q, L] in the scores' dtype, each row summing to less than 1 by the sink's share."""
    sink_column = sinks.to(scores.dtype).expand(*scores.shape[:-1], 1)
    combined = torch.cat([scores, sink_column], dim=-1)
    combined = combined - combined.amax(dim=-1, keepdim=True)  # HF's guard against overflow
    return torch.softmax(combined, dim=-1, dtype=combined.dtype)[..., :-1]


def rescale_by_sinks(out: torch.Tensor, lse: torch.Tensor, sinks: torch.Tensor) -> torch.Tensor:
    """Attention computed without the sink, out [..., D], and its natural-log log-sum-exp lse [...]
    -> the output with the sink in the denominator; sinks broadcastable to lse. A row that sees no key
    (lse -inf, out 0) stays 0."""
    return out * torch.sigmoid(lse.float() - sinks.float()).unsqueeze(-1).to(out.dtype)
