"""CPU linear layers through oneDNN, with each weight reordered once at load time.

nn.Linear on CPU calls MKL's sgemm, which takes its AVX-512 kernels only on Intel CPUs. On an
AMD Zen 4 box (2 cores) oneDNN with a pre-packed weight ran the default model's matmuls
([T, 256] x [256, 1376], [T, 688] x [688, 256], [T, 256] x [256, 4096], T = 8..2048) 1.0-2.5x
as fast as MKL (the LM head gains most); only single rows on the smallest weight were slower
(21 vs 14 us).

Both accumulate in float32 but in different orders, so results differ from HF transformers'
(MKL) in the last bits: greedy tokens agree except at near-ties, as with any reordering.
`cpu_linear="torch"` keeps nn.Linear for bit-level comparisons.

On CPUs without AVX-512 the picture splits by row count. On an AMD EPYC (Zen 3, AVX2, 2 vCPUs),
float32, SmolLM2's weights: a single row (single-stream decode) ran 1.5-2.2x as fast through
MKL's matrix-vector product as through the packed weight (576x576: 60 vs 130 us; the whole decode
step 83 vs 119 ms), while 8-256 rows ran up to 3x as fast packed (32 requests decoding together:
60 vs 41 tokens/s). `cpu_linear="auto"` (the default) therefore keeps the plain float32 weight
beside the packed one on such CPUs and sends single rows to MKL: the fastest of both, for twice
the linear layers' weight memory. With AVX-512 (measured on Zen 4 and on a Xeon with AMX) a
single row was about as fast packed, and auto is plain oneDNN.

oneDNN builds and caches one primitive per input shape, ~0.6 MiB each whatever the weight size
(measured), and a step's row count takes any value up to the token budget: unpadded, a long run
grew the process by 0.9 GiB (5M model) and a sweep of row counts by several GiB, between the
cached primitives and the heap fragmentation of their churn. So inputs are padded with zero rows
to a few row counts (padded_row_count), which bounds the cache at 49 shapes per weight shape up
to 2048 rows, for at most 7 extra rows (up to 128) or 1/8 more rows (above). Up to 8 rows the
padding is a small per-layer buffer the rows are copied into (one copy, not F.pad's allocate, fill and
copy for every layer of every decode step); what its spare rows hold is irrelevant, since each
output row depends on its own input row only.
"""

from __future__ import annotations

import structlog
import torch
import torch.nn.functional as F
from torch import nn

log = structlog.get_logger(__name__)

_PACKABLE_DTYPES = (torch.float32, torch.bfloat16)
_BUFFERED_ROWS = 8  # inputs padded to this many rows (decode of 1-7 sequences) use the layer's buffer


class PackedLinear(nn.Module):
    """y = x W^T + b with W held in oneDNN's blocked layout (not a Parameter: not trainable)."""

    def __init__(self, linear: nn.Linear, single_rows_plain: bool = False) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        # batch-size hint None: the layout suits every row count (measured: within noise of a hint).
        self.packed_weight = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), None)
        self.bias = linear.bias
        # The plain weight too, for one-row inputs through F.linear (MKL's gemv): see the module docstring.
        self.plain_weight = linear.weight.detach() if single_rows_plain else None
        self._small_rows = torch.zeros(_BUFFERED_ROWS, self.in_features, dtype=linear.weight.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        num_rows = rows.shape[0]
        if num_rows == 1 and self.plain_weight is not None:
            return F.linear(x, self.plain_weight, self.bias)
        padded = padded_row_count(num_rows)
        if padded != num_rows and padded == _BUFFERED_ROWS and rows.dtype == self._small_rows.dtype:
            self._small_rows[:num_rows].copy_(rows)
            rows = self._small_rows
        elif padded != num_rows:
            rows = F.pad(rows, (0, 0, 0, padded - num_rows))  # zero rows; their outputs are dropped
        out = torch.ops.mkldnn._linear_pointwise(rows, self.packed_weight, self.bias, "none", [], "")
        return out[:num_rows].view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"single_rows_plain={self.plain_weight is not None}")


def single_rows_plain(cpu_linear: str, dtype: torch.dtype) -> bool:
    """Whether `cpu_linear` sends one-row float32 inputs to MKL on this CPU (module docstring).

    Only float32: MKL has no bfloat16 product, torch would route bfloat16 back to oneDNN."""
    return cpu_linear == "auto" and dtype == torch.float32 and torch.backends.cpu.get_cpu_capability() != "AVX512"


def padded_row_count(rows: int) -> int:
    """`rows` rounded up to a multiple of 8, or of an eighth of its power-of-two range above 128.

    1..8 -> 8, 100 -> 104, 129 -> 144 (step 16 in (128, 256]), 2000 -> 2048 (step 128 in
    (1024, 2048]): 16 values up to 128, then 8 per doubling; at most 7 padding rows up to 128,
    at most 1/8 of the rows above.
    """
    if rows <= 128:
        return -(-rows // 8) * 8
    step = 1 << ((rows - 1).bit_length() - 4)  # (128, 256] -> 16, (256, 512] -> 32, ...
    return -(-rows // step) * step


def onednn_linear_works(dtype: torch.dtype) -> bool:
    """Whether this torch build packs and runs oneDNN linears in `dtype` (and agrees with F.linear)."""
    if dtype not in _PACKABLE_DTYPES or not torch.backends.mkldnn.is_available():
        return False
    try:
        generator = torch.Generator().manual_seed(0)
        linear = nn.Linear(32, 24, dtype=dtype)
        x = torch.randn(5, 32, generator=generator).to(dtype)
        with torch.no_grad():
            ours, reference = PackedLinear(linear)(x), F.linear(x, linear.weight, linear.bias)
    except (RuntimeError, AttributeError) as error:  # op missing or unsupported on this CPU
        log.info("oneDNN linear unavailable; using torch's", dtype=str(dtype), error=str(error))
        return False
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    return ours.shape == reference.shape and torch.allclose(ours.float(), reference.float(), atol=tolerance,
                                                            rtol=tolerance)


def pack_linears(model: nn.Module, single_rows_plain: bool = False) -> int:
    """Replace every nn.Linear in `model` by a PackedLinear of the same weights; returns how many.

    A weight tied to another module (lm_head and embed_tokens) is copied into the packed layout;
    the other module keeps the original.
    """
    replaced = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear:
                setattr(parent, name, PackedLinear(child, single_rows_plain))
                replaced += 1
    return replaced
