"""The gated delta rule and the short causal convolution of gated DeltaNet layers against HF transformers'
reference functions (modeling_qwen3_next.py), and the state pool's per-step rows.

HF's chunked form bit for bit from a zero or a given state; its per-token form on a decode step (1e-6: matmuls
where HF sums elementwise);
a sequence cut into chunks anywhere equal to it whole (float32 rounding: 2e-6); decays strong enough to reach
subnormal floats flushed to zero without a visible change; the convolution over a step's mixed sequences
(fresh, continuing, one token, shorter than the kernel) equal to HF's over each whole sequence.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from transformers.models.qwen3_next.modeling_qwen3_next import (
    causal_conv1d_fn,
    torch_chunk_gated_delta_rule,
    torch_recurrent_gated_delta_rule,
)

from pipeline.model.layers.gated_delta import causal_conv, chunked_rule, gated_delta_rule, recurrent_step
from pipeline.model.layers.recurrent_state import RecurrentStatePool, RecurrentStateShape, StateStep

HEADS, KEY_DIM, VALUE_DIM = 4, 16, 24


def _inputs(length: int, seed: int, max_rate: float = 4.0) -> tuple[torch.Tensor, ...]:
    """q, k [L, H, Dk], v [L, H, Dv], g, beta [L, H] as a layer makes them (decay rates up to max_rate)."""
    generator = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(length, HEADS, KEY_DIM, generator=generator) for _ in range(2))
    v = torch.randn(length, HEADS, VALUE_DIM, generator=generator)
    rates = 0.01 + (max_rate - 0.01) * torch.rand(HEADS, generator=generator)
    g = -rates * F.softplus(torch.randn(length, HEADS, generator=generator) + 1)
    beta = torch.rand(length, HEADS, generator=generator)
    return q, k, v, g, beta


def _hf_chunked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                initial: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """HF's chunked form on one sequence (its batch of one)."""
    out, state = torch_chunk_gated_delta_rule(q[None], k[None], v[None], g[None], beta[None],
                                              initial_state=None if initial is None else initial[None],
                                              output_final_state=True, use_qk_l2norm_in_kernel=True)
    return out[0], state[0]


@pytest.mark.parametrize("length", [1, 5, 64, 70, 200])
def test_the_chunked_form_is_hfs_bit_for_bit(length: int) -> None:
    q, k, v, g, beta = _inputs(length, seed=length, max_rate=1.0)
    initial = torch.randn(HEADS, KEY_DIM, VALUE_DIM) * 0.3
    for start in (None, initial):
        ours, our_state = chunked_rule(q, k, v, g, beta, start)
        theirs, their_state = _hf_chunked(q, k, v, g, beta, start)
        assert torch.equal(ours, theirs) and torch.equal(our_state, their_state)


def test_the_per_token_form_is_hfs_for_many_sequences_at_once() -> None:
    """One token of each of 5 sequences, each from its own state (HF: one call per sequence); matmuls where HF
    sums elementwise: 1e-6 apart."""
    q, k, v, g, beta = _inputs(5, seed=1)
    states = torch.randn(5, HEADS, KEY_DIM, VALUE_DIM)
    ours, our_states = recurrent_step(q, k, v, g, beta, states.clone())
    for n in range(5):
        theirs, their_state = torch_recurrent_gated_delta_rule(
            q[None, n:n + 1], k[None, n:n + 1], v[None, n:n + 1], g[None, n:n + 1], beta[None, n:n + 1],
            initial_state=states[None, n], output_final_state=True, use_qk_l2norm_in_kernel=True)
        torch.testing.assert_close(ours[n], theirs[0, 0], atol=1e-6, rtol=0)
        torch.testing.assert_close(our_states[n], their_state[0], atol=1e-6, rtol=0)


@pytest.mark.parametrize("cuts", [[33], [64], [1, 2, 3], [10, 90, 91, 150], list(range(1, 200, 7))])
def test_a_sequence_cut_into_chunks_equals_it_whole(cuts: list[int]) -> None:
    q, k, v, g, beta = _inputs(200, seed=3)
    whole, whole_state = chunked_rule(q, k, v, g, beta, None)
    outs, state = [], None
    for start, end in zip([0, *cuts], [*cuts, 200], strict=True):
        if end - start == 1 and state is not None:  # a one-token chunk takes the per-token form, as in a step
            out, state = recurrent_step(q[start:end], k[start:end], v[start:end], g[start:end], beta[start:end],
                                        state[None])
            out, state = out, state[0]
        else:
            out, state = chunked_rule(q[start:end], k[start:end], v[start:end], g[start:end], beta[start:end], state)
        outs.append(out)
    torch.testing.assert_close(torch.cat(outs), whole, atol=2e-6, rtol=0)
    torch.testing.assert_close(state, whole_state, atol=2e-6, rtol=0)


def test_subnormal_decays_are_flushed_without_a_visible_change() -> None:
    """Decay rates up to 16 (HF's init): products of decays fall below float32's smallest normal number."""
    q, k, v, g, beta = _inputs(200, seed=4, max_rate=16.0)
    assert float(g.cumsum(0).min()) < -88  # subnormal territory
    ours, our_state = chunked_rule(q, k, v, g, beta, None)
    theirs, their_state = _hf_chunked(q, k, v, g, beta)
    torch.testing.assert_close(ours, theirs, atol=1e-6, rtol=0)
    torch.testing.assert_close(our_state, their_state, atol=1e-6, rtol=0)


# --- a step over the pool ------------------------------------------------------------------------------------

_SHAPE = RecurrentStateShape(num_layers=1, conv_channels=6, conv_kernel=4, num_heads=HEADS, key_dim=KEY_DIM,
                             value_dim=VALUE_DIM)


def _pool_step(pool: RecurrentStatePool, chunks: list[tuple[int, int, int]]) -> StateStep:
    """chunks: (slot, first position, length) -> the pool's StateStep."""
    positions = np.concatenate([np.arange(start, start + length) for _, start, length in chunks])
    lengths = [length for _, _, length in chunks]
    query_start_loc = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    seq_lens = np.array([start + length for _, start, length in chunks], np.int32)
    return pool.step(positions, query_start_loc, seq_lens, np.array([slot for slot, _, _ in chunks], np.int32))


def test_the_conv_rows_of_the_worked_example() -> None:
    """recurrent_state.py's docstring: a sequence continuing with 2 tokens, a fresh one with 1, kernel 4."""
    pool = RecurrentStatePool(_SHAPE, num_slots=4, dtype=torch.float32, device=torch.device("cpu"))
    _pool_step(pool, [(2, 0, 5)])
    step = _pool_step(pool, [(2, 5, 2), (0, 0, 1)])
    assert step.conv_rows.tolist() == [[0, 1, 2, 6], [1, 2, 6, 7], [3, 4, 5, 8]]
    assert step.conv_keep.tolist() == [[2, 6, 7], [4, 5, 8]]
    assert step.fresh.tolist() == [False, True] and step.prefills == [(0, 2, 2, False)]
    assert step.decode_seqs.tolist() == [1] and step.decode_tokens.tolist() == [2]


def test_the_convolution_of_mixed_sequences_equals_hfs_over_each_whole_sequence() -> None:
    """Three sequences over three steps: chunks longer and shorter than the kernel, one-token steps, a slot
    reused by a fresh sequence; each token's output equals HF's causal_conv1d_fn over its whole sequence."""
    channels = _SHAPE.conv_channels
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(channels, 4, generator=generator)
    tokens = {seq: torch.randn(length, channels, generator=generator) for seq, length in enumerate((9, 3, 6))}
    pool = RecurrentStatePool(_SHAPE, num_slots=4, dtype=torch.float32, device=torch.device("cpu"))
    pool.conv[0].fill_(7.0)  # what earlier sequences left: a fresh one must not see it
    steps = [[(0, 1, 0, 5), (1, 3, 0, 2)], [(1, 3, 2, 1), (0, 1, 5, 1)], [(0, 1, 6, 3), (2, 0, 0, 6)]]
    for step_chunks in steps:  # (sequence, slot, first position, length)
        step = _pool_step(pool, [(slot, start, length) for _, slot, start, length in step_chunks])
        x = torch.cat([tokens[seq][start:start + length] for seq, _, start, length in step_chunks])
        out = causal_conv(x, weight, pool.conv[0], step)
        row = 0
        for seq, _, start, length in step_chunks:
            whole = causal_conv1d_fn(tokens[seq][None].transpose(1, 2), weight, activation="silu")[0].T
            torch.testing.assert_close(out[row:row + length], whole[start:start + length], atol=1e-6, rtol=0)
            row += length


def test_a_step_runs_each_sequence_from_its_own_state() -> None:
    """gated_delta_rule over a step of two continuing decodes and a fresh prefill chunk (2 key heads serving 4
    value heads) equals each sequence on its own, from its slot's state or from zero."""
    pool = RecurrentStatePool(_SHAPE, num_slots=4, dtype=torch.float32, device=torch.device("cpu"))
    pool.recurrent[0].copy_(torch.randn(4, HEADS, KEY_DIM, VALUE_DIM))
    pool.next_position[[3, 0]] = 4  # slots 3 and 0 hold states up to position 4
    start_states = pool.recurrent[0].clone()
    q, k, v, g, beta = _inputs(12, seed=5)
    step = _pool_step(pool, [(3, 4, 1), (1, 0, 10), (0, 4, 1)])
    out = gated_delta_rule(q[:, :2], k[:, :2], v, g, beta, pool.recurrent[0], step)
    qr, kr = q[:, :2].repeat_interleave(2, dim=1), k[:, :2].repeat_interleave(2, dim=1)
    for rows, slot in ((slice(0, 1), 3), (slice(11, 12), 0)):
        start = start_states[slot][None].clone()  # (updated in place)
        alone, state = recurrent_step(qr[rows], kr[rows], v[rows], g[rows], beta[rows], start)
        assert torch.equal(out[rows], alone) and torch.equal(pool.recurrent[0][slot], state[0])
    alone, state = chunked_rule(qr[1:11], kr[1:11], v[1:11], g[1:11], beta[1:11], None)
    assert torch.equal(out[1:11], alone) and torch.equal(pool.recurrent[0][1], state)
    assert torch.equal(pool.recurrent[0][2], start_states[2])  # a slot outside the step is left alone
