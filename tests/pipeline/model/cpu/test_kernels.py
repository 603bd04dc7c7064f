"""The native CPU decode kernel against the portable torch path (and so against SDPA)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline.model.cpu.kernels import load_decode_kernel
from pipeline.request.sampling_params import SamplingParams
from tests.support.engine_helpers import make_engine, run_requests
from tests.support.hf_models import make_tiny_hf_model

kernel = load_decode_kernel()
pytestmark = pytest.mark.skipif(kernel is None, reason="no C compiler: the CPU kernel is not built here")


def _reference(q, kv_cache, block_tables, seq_lens, scale, window=0, softcap=0.0):
    """Per-sequence attention over the sequence's own (visible) slots, GQA by repeating K/V heads."""
    block_size, num_kv_heads = kv_cache.shape[2], kv_cache.shape[3]
    out = torch.empty_like(q)
    for seq, length in enumerate(seq_lens.tolist()):
        positions = torch.arange(max(0, length - window) if window else 0, length)
        blocks = block_tables[seq, positions // block_size].long()
        keys = kv_cache[0, blocks, positions % block_size]  # [L, H_kv, D]
        values = kv_cache[1, blocks, positions % block_size]
        group = q.shape[1] // num_kv_heads
        keys, values = keys.repeat_interleave(group, 1), values.repeat_interleave(group, 1)
        scores = torch.einsum("hd,lhd->hl", q[seq], keys) * scale
        if softcap:
            scores = softcap * torch.tanh(scores / softcap)
        out[seq] = torch.einsum("hl,lhd->hd", torch.softmax(scores, dim=-1), values)
    return out


def _check_against_sdpa(num_heads, num_kv_heads, head_dim, block_size, seq_lens, q_scale=1.0, seed=0):
    """Random cache, blocks scattered through it, kernel output against _reference."""
    generator = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)
    num_seqs = len(seq_lens)
    seq_lens = torch.tensor(seq_lens, dtype=torch.int32)
    max_blocks = -(-int(seq_lens.max()) // block_size)
    num_blocks = num_seqs * max_blocks + 5
    kv_cache = torch.randn(2, num_blocks, block_size, num_kv_heads, head_dim, generator=generator)
    block_tables = torch.from_numpy(rng.permutation(num_blocks)[: num_seqs * max_blocks]
                                    .reshape(num_seqs, max_blocks).astype(np.int32))
    q = torch.randn(num_seqs, num_heads, head_dim, generator=generator) * q_scale
    scale = head_dim**-0.5
    out = kernel(q, kv_cache, block_tables, seq_lens, int(seq_lens.max()), scale)
    torch.testing.assert_close(out, _reference(q, kv_cache, block_tables, seq_lens, scale), atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize(("num_heads", "num_kv_heads", "head_dim", "block_size", "q_scale"),
                         [(4, 4, 16, 1, 1.0), (8, 2, 64, 16, 1.0), (8, 1, 32, 4, 1.0), (6, 3, 128, 8, 1.0),
                          # Scores spread over hundreds: the kernel's exp sees arguments far below -87.
                          (4, 2, 64, 16, 40.0),
                          # head_dim not a multiple of the 8-float vector: 24 and 40 are whole vectors
                          # but not 64-float slices, 17 and 3 leave a scalar tail; group sizes 1, 4 and 8;
                          # block sizes that are not a multiple of the 8-wide score padding.
                          (2, 2, 24, 3, 1.0), (16, 2, 40, 16, 1.0), (4, 1, 17, 5, 1.0), (8, 4, 96, 32, 1.0),
                          (2, 1, 3, 2, 1.0)])
def test_kernel_matches_sdpa(num_heads, num_kv_heads, head_dim, block_size, q_scale):
    seq_lens = np.random.default_rng(block_size).integers(1, 200, 9).tolist()
    _check_against_sdpa(num_heads, num_kv_heads, head_dim, block_size, seq_lens, q_scale,
                        seed=num_heads * head_dim + block_size)


@pytest.mark.parametrize(("head_dim", "block_size"), [(64, 16), (20, 8), (128, 3)])
def test_kernel_at_lengths_around_padding_and_block_edges(head_dim, block_size):
    # The kernel pads each head's scores to a multiple of 8 for its vectorized softmax: lengths 1,
    # just under, at and just over a multiple of 8 or a block, and several blocks plus one.
    seq_lens = [1, 2, 7, 8, 9, 15, 16, 17, 24, 25, 3 * block_size, 3 * block_size + 1]
    _check_against_sdpa(4, 2, head_dim, block_size, seq_lens, seed=head_dim + block_size)


@pytest.mark.parametrize(("window", "softcap"), [(5, 0.0), (16, 0.0), (37, 0.0), (0, 3.0), (9, 2.0)])
def test_kernel_with_a_sliding_window_and_soft_capping(window, softcap):
    generator = torch.Generator().manual_seed(window)
    block_size, num_heads, num_kv_heads, head_dim = 4, 8, 2, 64
    seq_lens = torch.tensor([1, 4, 5, 9, 16, 17, 40, 41, 77], dtype=torch.int32)
    max_blocks = -(-int(seq_lens.max()) // block_size)
    num_blocks = len(seq_lens) * max_blocks + 1
    kv_cache = torch.randn(2, num_blocks, block_size, num_kv_heads, head_dim, generator=generator)
    block_tables = torch.randperm(num_blocks - 1, generator=generator)[: len(seq_lens) * max_blocks]
    block_tables = block_tables.reshape(len(seq_lens), max_blocks).to(torch.int32)
    if window:
        # Blocks wholly before the window are released by the KV manager: their entries are -1
        # and must never be read.
        for seq, length in enumerate(seq_lens.tolist()):
            block_tables[seq, : max(0, length - window) // block_size] = -1
    q = torch.randn(len(seq_lens), num_heads, head_dim, generator=generator) * 3.0
    scale = head_dim**-0.5
    out = kernel(q, kv_cache, block_tables, seq_lens, int(seq_lens.max()), scale, window=window, softcap=softcap)
    expected = _reference(q, kv_cache, block_tables, seq_lens, scale, window, softcap)
    torch.testing.assert_close(out, expected, atol=2e-5, rtol=1e-5)


def test_engine_gives_the_same_tokens_with_and_without_the_kernel(tmp_path):
    path = make_tiny_hf_model("qwen3", tmp_path / "qwen3", seed=4)
    rng = np.random.default_rng(0)
    requests = {f"r{i}": (rng.integers(3, 512, int(rng.integers(2, 70))).tolist(),
                          SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True, logprobs=2))
                for i in range(8)}
    with_kernel = make_engine(path, block_size=4)
    assert with_kernel.runner.backend.decode_kernel is not None
    without = make_engine(path, block_size=4)
    without.runner.backend.decode_kernel = None
    ours, theirs = run_requests(with_kernel, requests), run_requests(without, requests)
    for request_id in requests:
        a, b = ours[request_id]["choices"][0], theirs[request_id]["choices"][0]
        for position, (x, y) in enumerate(zip(a["logprobs"], b["logprobs"], strict=True)):
            if x.token_id != y.token_id:
                # Float rounding may flip a greedy pick only where the top two are all but tied;
                # after that the two continuations differ and are not comparable.
                (_, first), (_, second) = y.top[:2]
                assert first - second < 1e-3, f"{request_id} diverged at {position} without a near-tie"
                break
            assert abs(x.logprob - y.logprob) < 1e-4


@pytest.mark.parametrize(("num_heads", "num_kv_heads", "head_dim", "block_size"),
                         [(8, 2, 64, 16), (4, 1, 17, 5), (6, 3, 128, 8)])
def test_kernel_reads_bfloat16_kv(num_heads, num_kv_heads, head_dim, block_size):
    # bfloat16 K/V are widened to float32 as they are read: the result equals float32 attention
    # over the same (bfloat16-rounded) values, to float32 accuracy, and comes back in q's dtype.
    generator = torch.Generator().manual_seed(head_dim)
    seq_lens = torch.tensor([1, 9, 16, 33, 70], dtype=torch.int32)
    max_blocks = -(-int(seq_lens.max()) // block_size)
    num_blocks = len(seq_lens) * max_blocks
    kv_cache = torch.randn(2, num_blocks, block_size, num_kv_heads, head_dim, generator=generator).bfloat16()
    block_tables = torch.randperm(num_blocks, generator=generator).to(torch.int32).reshape(len(seq_lens), -1)
    q = torch.randn(len(seq_lens), num_heads, head_dim, generator=generator).bfloat16()
    scale = head_dim**-0.5
    out = kernel(q, kv_cache, block_tables, seq_lens, int(seq_lens.max()), scale)
    assert out.dtype == torch.bfloat16
    expected = _reference(q.float(), kv_cache.float(), block_tables, seq_lens, scale)
    torch.testing.assert_close(out.float(), expected.bfloat16().float(), atol=1e-2, rtol=1e-2)
    exact = kernel(q.float(), kv_cache, block_tables, seq_lens, int(seq_lens.max()), scale)
    torch.testing.assert_close(exact, expected, atol=2e-5, rtol=1e-5)
    assert torch.equal(out, exact.bfloat16())  # bfloat16 q is widened exactly; out is rounded once


@pytest.mark.parametrize(("head_dim", "num_tokens"), [(32, 5), (40, 400)],
                         ids=["whole-vectors", "vector-and-tail-threaded"])  # 400 tokens: 320 KB+, two threads
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_kv_kernel_is_bit_identical_to_the_torch_path(dtype, head_dim, num_tokens):
    from pipeline.model.cpu.kernels import load_rope_kv_kernel
    from pipeline.model.layers.rope import RopeParams, RotaryEmbedding, apply_rotary

    rope_kv = load_rope_kv_kernel()
    assert rope_kv is not None
    generator = torch.Generator().manual_seed(1)
    num_heads, num_kv_heads = 6, 2
    rotary = RotaryEmbedding(head_dim, 64, RopeParams(theta=10000.0))
    rotary.build("cpu")
    positions = torch.tensor([0, 3, 17, 40, 63]) if num_tokens == 5 else torch.arange(num_tokens) % 64
    cos, sin = rotary.lookup(positions, dtype)
    qkv = (torch.randn(num_tokens, (num_heads + 2 * num_kv_heads) * head_dim, generator=generator) * 3).to(dtype)
    kv_cache = torch.zeros(2, 4 if num_tokens == 5 else num_tokens // 4, 4, num_kv_heads, head_dim, dtype=dtype)
    slots = (torch.tensor([5, -1, 0, 15, 9]) if num_tokens == 5 else
             torch.where(torch.arange(num_tokens) % 7 == 3, -1, torch.randperm(num_tokens, generator=generator)))
    heads = qkv[:, :(num_heads + num_kv_heads) * head_dim].view(num_tokens, -1, head_dim)
    expected = apply_rotary(heads, cos, sin).reshape(num_tokens, -1)
    values = qkv[:, (num_heads + num_kv_heads) * head_dim:].clone()
    ours = qkv.clone()
    assert rope_kv.applies(ours, cos, kv_cache, slots)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        rope_kv(ours, cos, sin, kv_cache, slots, num_heads, num_kv_heads, head_dim)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(ours[:, :(num_heads + num_kv_heads) * head_dim], expected)
    assert torch.equal(ours[:, (num_heads + num_kv_heads) * head_dim:], values)  # v is not rotated
    flat = kv_cache.view(2, -1, num_kv_heads * head_dim)
    keys = expected[:, num_heads * head_dim:]
    for row, slot in enumerate(slots.tolist()):
        if slot >= 0:
            assert torch.equal(flat[0, slot], keys[row]) and torch.equal(flat[1, slot], values[row])
    written = int((slots >= 0).sum())
    assert int(torch.count_nonzero(flat.abs().sum(-1))) == 2 * written  # only the slots given were written


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("seq_lens", [[3000], [700, 650, 20]])
def test_kernel_splits_sequences_by_kv_head_without_changing_results(dtype, seq_lens):
    """Work is split in (sequence, KV head) units: one long sequence runs on two threads, and with
    3 KV heads and 2 units per task, tasks end inside sequences; the output is bit for bit the
    one-thread output, and equals the reference."""
    num_heads, num_kv_heads, head_dim, block_size = 6, 3, 64, 16
    generator = torch.Generator().manual_seed(9)
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    max_blocks = -(-int(lens.max()) // block_size)
    kv_cache = torch.randn(2, len(seq_lens) * max_blocks, block_size, num_kv_heads, head_dim,
                           generator=generator).to(dtype)
    block_tables = torch.arange(len(seq_lens) * max_blocks, dtype=torch.int32).view(len(seq_lens), max_blocks)
    q = torch.randn(len(seq_lens), num_heads, head_dim, generator=generator).to(dtype)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        split = kernel(q, kv_cache, block_tables, lens, int(lens.max()), head_dim**-0.5)
        torch.set_num_threads(1)
        whole = kernel(q, kv_cache, block_tables, lens, int(lens.max()), head_dim**-0.5)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(split, whole)
    reference = _reference(q.float(), kv_cache.float(), block_tables, lens, head_dim**-0.5)
    tolerance = 2e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(split.float(), reference, atol=tolerance, rtol=tolerance)


@pytest.mark.parametrize(("num_heads", "num_kv_heads", "head_dim", "seq_lens", "window", "softcap", "with_sinks"),
                         [(4, 1, 64, [1500], 0, 0.0, False),  # one KV head: one unit
                          (6, 3, 64, [900], 600, 30.0, True),  # window, soft-capping, sinks
                          (4, 1, 40, [700, 520, 30], 0, 0.0, False),  # head_dim with no halves of whole vectors
                          (8, 2, 128, [1030], 0, 0.0, True)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_few_units_split_by_tokens_give_the_one_thread_output(num_heads, num_kv_heads, head_dim, seq_lens, window,
                                                              softcap, with_sinks, dtype):
    """Fewer (sequence, KV head) units than twice the threads and a long sequence: the kernel splits
    the passes by tokens and by halves of head_dim instead; every element is bit for bit the one-thread
    output, and equals the reference."""
    block_size = 16
    generator = torch.Generator().manual_seed(len(seq_lens) + head_dim)
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    max_blocks = -(-int(lens.max()) // block_size)
    kv_cache = torch.randn(2, len(seq_lens) * max_blocks + 3, block_size, num_kv_heads, head_dim,
                           generator=generator).to(dtype)
    block_tables = torch.randperm(len(seq_lens) * max_blocks + 3, generator=generator)[: len(seq_lens) * max_blocks]
    block_tables = block_tables.to(torch.int32).view(len(seq_lens), max_blocks)
    q = torch.randn(len(seq_lens), num_heads, head_dim, generator=generator).to(dtype)
    sinks = torch.randn(num_heads, generator=generator) if with_sinks else None
    threads = torch.get_num_threads()
    outputs = []
    try:
        for count in (2, 3, 1):
            torch.set_num_threads(count)
            outputs.append(kernel(q, kv_cache, block_tables, lens, int(lens.max()), head_dim**-0.5, window=window,
                                  softcap=softcap, sinks=sinks))
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(outputs[0], outputs[2]) and torch.equal(outputs[1], outputs[2])
    if sinks is None:
        reference = _reference(q.float(), kv_cache.float(), block_tables, lens, head_dim**-0.5, window, softcap)
        tolerance = 2e-5 if dtype == torch.float32 else 1e-2
        torch.testing.assert_close(outputs[0].float(), reference, atol=tolerance, rtol=tolerance)
