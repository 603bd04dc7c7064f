"""Attention sinks (gpt-oss) in the paged backends: the torch backend's decode and prefill (windows, GQA,
cached context, padding) equal HF's eager gpt-oss attention over the whole sequence; the native decode
kernel's sinks equal the torch path's (float32 and bfloat16 caches, windows); FlexAttention's
log-sum-exp rescaling equals the torch backend, and FlexAttention with sinks is refused on the CPU (its
compiled kernel has no log-sum-exp)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from torch.nn.attention.flex_attention import BlockMask, flex_attention
from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward

from pipeline.model.attention import flex as flex_module
from pipeline.model.attention.flex import FlexPagedAttention
from pipeline.model.attention.paged import TorchPagedAttention
from pipeline.model.attention.selection import make_backend
from pipeline.model.attention.shape import AttentionShape
from pipeline.model.attention.sinks import rescale_by_sinks, sink_softmax
from pipeline.model.cpu.kernels import load_decode_kernel
from pipeline.step.inputs import StepInputs
from tests.pipeline.model.attention.test_flex import DEVICE, MIXED_STEP, NUM_BLOCKS

HEADS, KV_HEADS, HEAD_DIM, BLOCK_SIZE, SCALE = 4, 2, 16, 4, 0.3
# (cached context, new tokens) per sequence: decodes, chunks after context, a first prefill.
STEP = [(13, 1), (6, 11), (2, 1), (30, 3), (0, 9)]


def _step(rng: np.random.Generator, chunks: list[tuple[int, int]], num_padding: int = 0) -> StepInputs:
    """A step over sequences whose blocks are drawn without repeats (as tests/.../test_flex.py's)."""
    free = list(rng.permutation(NUM_BLOCKS))
    positions, slots, query_lens, seq_lens, tables = [], [], [], [], []
    for context, new in chunks:
        table = [int(free.pop()) for _ in range(-(-(context + new) // BLOCK_SIZE))]
        pos = np.arange(context, context + new)
        positions += pos.tolist()
        slots += (np.array(table)[pos // BLOCK_SIZE] * BLOCK_SIZE + pos % BLOCK_SIZE).tolist()
        query_lens.append(new)
        seq_lens.append(context + new)
        tables.append(table)
    block_tables = np.zeros((len(chunks), max(len(t) for t in tables)), dtype=np.int32)
    for row, table in enumerate(tables):
        block_tables[row, :len(table)] = table
    total = len(positions)
    query_start_loc = np.concatenate([[0], np.cumsum(query_lens)]).astype(np.int32)
    return StepInputs(np.zeros(total + num_padding, np.int64), np.array(positions + [0] * num_padding),
                      np.array(slots + [-1] * num_padding), query_start_loc,
                      np.array(seq_lens, np.int32), block_tables, np.arange(total), total, max(query_lens),
                      max(seq_lens))


def _hf_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sinks: torch.Tensor,
                  window: int | None) -> torch.Tensor:
    """HF's eager gpt-oss attention of one whole sequence: q [L, H, D], k/v [L, H_kv, D] -> [L, H, D]."""
    length = q.shape[0]
    positions = torch.arange(length)
    visible = positions[None, :] <= positions[:, None]
    if window:
        visible &= positions[None, :] > positions[:, None] - window
    mask = torch.zeros(length, length).masked_fill(~visible, torch.finfo(torch.float32).min)
    module = SimpleNamespace(num_key_value_groups=HEADS // KV_HEADS, sinks=sinks, training=False)
    out, _ = eager_attention_forward(module, q.transpose(0, 1)[None], k.transpose(0, 1)[None],
                                     v.transpose(0, 1)[None], mask[None, None], scaling=SCALE)
    return out[0]


def _sequence_kv(cache: torch.Tensor, inputs: StepInputs, seq: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A sequence's keys and values from the cache, positions 0 .. seq_len - 1."""
    length = int(inputs.seq_lens[seq])
    positions = np.arange(length)
    slots = inputs.block_tables[seq][positions // BLOCK_SIZE] * BLOCK_SIZE + positions % BLOCK_SIZE
    flat = cache.view(2, -1, KV_HEADS, HEAD_DIM)
    return flat[0][torch.from_numpy(slots).long()], flat[1][torch.from_numpy(slots).long()]


@pytest.mark.parametrize("window", [None, 5])
def test_torch_backend_with_sinks_equals_hf_eager_attention(window: int | None) -> None:
    rng = np.random.default_rng(0)
    generator = torch.Generator().manual_seed(0)
    backend = TorchPagedAttention(HEADS, KV_HEADS, HEAD_DIM, BLOCK_SIZE, SCALE, windows=frozenset({window}))
    inputs = _step(rng, STEP, num_padding=2)
    tokens = len(inputs.input_ids)
    cache = torch.randn(2, NUM_BLOCKS, BLOCK_SIZE, KV_HEADS, HEAD_DIM, generator=generator)
    q = torch.randn(tokens, HEADS, HEAD_DIM, generator=generator)
    k, v = (torch.randn(tokens, KV_HEADS, HEAD_DIM, generator=generator) for _ in range(2))
    sinks = torch.tensor([2.0, -1.0, 0.5, 3.0])
    out = backend.forward(q, k, v, cache, backend.build_metadata(inputs, torch.device("cpu")), window, sinks=sinks)
    for seq, start in enumerate(inputs.query_start_loc[:-1]):
        new = int(inputs.query_start_loc[seq + 1] - start)
        keys, values = _sequence_kv(cache, inputs, seq)  # the step's own k/v were written first
        context = int(inputs.seq_lens[seq]) - new
        full_q = torch.cat([torch.zeros(context, HEADS, HEAD_DIM), q[start:start + new]])
        expected = _hf_attention(full_q, keys, values, sinks, window)[context:]
        torch.testing.assert_close(out[start:start + new], expected, atol=1e-5, rtol=1e-5)
    assert not out[inputs.num_tokens:].any()  # padding rows


def test_sinks_take_weight_from_every_key() -> None:
    """-inf sinks are plain attention; a finite sink only shrinks the row's weights (they sum below 1)."""
    generator = torch.Generator().manual_seed(1)
    scores = torch.randn(2, 1, 3, 7, generator=generator).expand(2, 4, 3, 7)  # the same scores in each head
    plain = torch.softmax(scores, dim=-1)
    torch.testing.assert_close(sink_softmax(scores, torch.full((1, 4, 1, 1), -torch.inf)), plain)
    with_sinks = sink_softmax(scores, torch.tensor([0.0, 1.0, 2.0, 3.0]).view(1, 4, 1, 1))
    share = 1 - with_sinks.sum(-1)  # the sink's weight, growing with the sink logit
    assert (share > 0).all() and (share[:, 1:] > share[:, :-1]).all()
    torch.testing.assert_close(with_sinks / with_sinks.sum(-1, keepdim=True), plain)


def test_rescaling_by_the_log_sum_exp_equals_the_sink_softmax() -> None:
    generator = torch.Generator().manual_seed(2)
    scores, values = torch.randn(2, 4, 3, 7, generator=generator), torch.randn(2, 4, 7, 5, generator=generator)
    sinks = torch.tensor([0.0, 1.0, 2.0, -3.0]).view(1, 4, 1)
    plain = torch.softmax(scores, dim=-1) @ values
    rescaled = rescale_by_sinks(plain, torch.logsumexp(scores, dim=-1), sinks)
    torch.testing.assert_close(rescaled, sink_softmax(scores, sinks.unsqueeze(-1)) @ values)


@pytest.mark.parametrize("window", [None, 6])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_native_decode_kernel_sinks_equal_the_torch_path(window: int | None, dtype: torch.dtype) -> None:
    kernel = load_decode_kernel()
    if kernel is None:
        pytest.skip("the native decode kernel is unavailable (no C compiler)")
    decodes = [(13, 1), (2, 1), (40, 1)]
    inputs = _step(np.random.default_rng(3), decodes)
    generator = torch.Generator().manual_seed(3)
    q = torch.randn(len(decodes), HEADS, HEAD_DIM, generator=generator).to(dtype)
    k, v = (torch.randn(len(decodes), KV_HEADS, HEAD_DIM, generator=generator).to(dtype) for _ in range(2))
    cache = torch.randn(2, NUM_BLOCKS, BLOCK_SIZE, KV_HEADS, HEAD_DIM, generator=generator).to(dtype)
    sinks = torch.tensor([2.0, -1.0, 0.5, 3.0]).to(dtype)
    native, torch_path = (TorchPagedAttention(HEADS, KV_HEADS, HEAD_DIM, BLOCK_SIZE, SCALE,
                                              windows=frozenset({window})) for _ in range(2))
    native.decode_kernel = kernel
    metadata = native.build_metadata(inputs, torch.device("cpu"))
    assert all(group.block_tables is not None for group in metadata.views[window].decodes)  # the kernel's groups
    got = native.forward(q, k, v, cache.clone(), metadata, window, sinks=sinks)
    want = torch_path.forward(q.float(), k.float(), v.float(), cache.float(),
                              torch_path.build_metadata(inputs, torch.device("cpu")), window, sinks=sinks.float())
    tolerance = 1e-5 if dtype == torch.float32 else 1e-2  # the kernel rounds only its output to bfloat16
    torch.testing.assert_close(got.float(), want, atol=tolerance, rtol=tolerance)
    without = native.forward(q, k, v, cache.clone(), metadata, window)
    assert (without.float() - got.float()).abs().max() > 0.1  # the sinks are in the kernel's softmax


def _reference_flex_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *,
                              block_mask: BlockMask, **options: Any) -> Any:
    """flex_attention uncompiled (torch's reference math), visiting only the listed blocks as the kernels do:
    the reference evaluates mask_mod everywhere, and the paged mask is only meaningful in listed blocks."""
    listed = block_mask.to_dense()  # [tiles, 1, q blocks, kv blocks]
    q_block, kv_block = block_mask.BLOCK_SIZE
    paged_mask = block_mask.mask_mod

    def mask_mod(b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        return (listed[b, 0, q // q_block, kv // kv_block] > 0) & paged_mask(b, h, q, kv)

    block_mask.mask_mod = mask_mod
    options.pop("kernel_options", None)
    return flex_attention(query, key, value, block_mask=block_mask, **options)


def test_flex_rescaled_by_sinks_equals_torch_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    """FlexAttention's log-sum-exp, here from its uncompiled reference: torch.compile's CPU kernel returns
    none, so make_backend refuses sinks with FlexAttention on the CPU (the CUDA kernel does return it)."""
    monkeypatch.setattr(flex_module, "compiled_flex_attention", lambda _device_type: _reference_flex_attention)
    chunks, padding = MIXED_STEP
    device = torch.device(DEVICE)
    args = (HEADS, KV_HEADS, HEAD_DIM, BLOCK_SIZE, SCALE)
    windows = frozenset({7})
    flex = FlexPagedAttention(*args, windows=windows)
    reference = TorchPagedAttention(*args, windows=windows)
    inputs = _step(np.random.default_rng(4), chunks, padding)
    tokens = len(inputs.input_ids)
    q = torch.randn(tokens, HEADS, HEAD_DIM, device=device)
    k, v = (torch.randn(tokens, KV_HEADS, HEAD_DIM, device=device) for _ in range(2))
    sinks = torch.tensor([2.0, -1.0, 0.5, 3.0], device=device)
    cache = torch.randn(2, NUM_BLOCKS, BLOCK_SIZE, KV_HEADS, HEAD_DIM, device=device)
    flex_cache, reference_cache = cache.clone(), cache.clone()
    got = flex.forward(q, k, v, flex_cache, flex.build_metadata(inputs, device), 7, sinks=sinks)
    want = reference.forward(q, k, v, reference_cache, reference.build_metadata(inputs, device), 7, sinks=sinks)
    real = inputs.num_tokens
    torch.testing.assert_close(got[:real], want[:real], atol=1e-5, rtol=1e-5)


def test_flex_with_sinks_is_refused_on_the_cpu() -> None:
    shape = AttentionShape(num_layers=1, num_heads=HEADS, num_kv_heads=KV_HEADS, head_dim=HEAD_DIM, scale=SCALE,
                           layer_windows=(None,), attention_sinks=True)
    with pytest.raises(ValueError, match=r"attention sinks \(gpt-oss\) are not supported by FlexAttention on the CPU"):
        make_backend("flex", shape, BLOCK_SIZE, torch.device("cpu"), torch.float32)
    assert isinstance(make_backend("auto", shape, BLOCK_SIZE, torch.device("cpu"), torch.float32),
                      TorchPagedAttention)
