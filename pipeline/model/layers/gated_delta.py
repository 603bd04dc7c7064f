"""The gated delta rule and the short causal convolution of gated DeltaNet layers, as HF transformers
computes them (modeling_qwen3_next.py: torch_chunk_gated_delta_rule, torch_recurrent_gated_delta_rule,
causal_conv1d_fn / causal_conv1d_update).

Per value head the state S is a [key_dim, value_dim] matrix; for each token (q and k L2-normalised, q
scaled by key_dim ** -0.5, g <= 0 the log decay, beta in (0, 1) the write strength):

    S = exp(g) * S
    S = S + k (beta * (v - S^T k))^T       the delta rule: write only what S does not already predict
    out = S^T q

A prefill chunk runs HF's chunked form of the same recurrence (chunks of 64 tokens: a triangular solve
and a few matmuls per chunk, one loop step per 64 tokens) from the state its sequence reached, and a
decode step runs the per-token form for every decoding sequence at once. Everything runs in float32.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from pipeline.model.layers.recurrent_state import StateStep

CHUNK_SIZE = 64  # HF's chunk_size
# exp(x) below float32's smallest normal number (1.2e-38) is subnormal, and CPUs compute with subnormals
# tens of times more slowly. A chunk's cumulative decays (products of up to 64 factors exp(g) < 1) reach them
# and made a prefill 5x slower; so the chunked form flushes them to zero, where HF keeps values below 1.2e-38
# beside terms of order 1. (States stayed normal, each token writing to them anew: none of 38 M state values
# was subnormal after decodes on a model with HF's initial decay rates, so the per-token form flushes nothing.)
_LOG_TINY = math.log(torch.finfo(torch.float32).tiny)


def _exp(x: torch.Tensor) -> torch.Tensor:
    """exp(x), zero where it would be subnormal."""
    return x.masked_fill(x < _LOG_TINY, float("-inf")).exp()


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def causal_conv(x: torch.Tensor, weight: torch.Tensor, conv_state: torch.Tensor, step: StateStep) -> torch.Tensor:
    """SiLU of each sequence's causal depthwise convolution: x [T, C] (the step's tokens), weight [C, kernel].

    Each token reads the kernel - 1 inputs before it, from its own chunk or from its slot's kept window
    (zeros for a fresh sequence); the slots keep their last kernel - 1 inputs (recurrent_state.py).
    """
    windows = conv_state.index_select(0, step.slots).masked_fill(step.fresh[:, None, None], 0)
    rows = torch.cat([windows.flatten(0, 1), x]).float()
    weight = weight.float()
    out = rows[step.conv_rows[:, 0]] * weight[:, 0]
    for j in range(1, weight.shape[1]):
        out = out + rows[step.conv_rows[:, j]] * weight[:, j]
    conv_state.index_copy_(0, step.slots, rows[step.conv_keep].to(conv_state.dtype))
    return F.silu(out.to(x.dtype))


def gated_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                     recurrent: torch.Tensor, step: StateStep) -> torch.Tensor:
    """Every sequence's chunk through its slot's state: q, k [T, key heads, Dk], v [T, value heads, Dv],
    g (float32), beta [T, value heads] -> [T, value heads, Dv] in v's dtype; `recurrent` [slots, value heads,
    Dk, Dv] is updated in place. Each key head serves value_heads / key_heads consecutive value heads."""
    dtype, repeat = v.dtype, v.shape[1] // k.shape[1]
    if repeat > 1:
        q, k = q.repeat_interleave(repeat, dim=1), k.repeat_interleave(repeat, dim=1)
    q, k, v, beta = q.float(), k.float(), v.float(), beta.float()
    out = torch.zeros(v.shape, dtype=torch.float32, device=v.device)
    if len(step.decode_seqs):
        rows = step.decode_tokens
        slots = step.slots.index_select(0, step.decode_seqs)
        fresh = step.fresh.index_select(0, step.decode_seqs)
        state = recurrent.index_select(0, slots).masked_fill_(fresh[:, None, None, None], 0)
        out[rows], state = recurrent_step(q[rows], k[rows], v[rows], g[rows], beta[rows], state)
        recurrent.index_copy_(0, slots, state)
    for start, end, slot, fresh_start in step.prefills:
        initial = None if fresh_start else recurrent[slot]
        out[start:end], recurrent[slot] = chunked_rule(q[start:end], k[start:end], v[start:end], g[start:end],
                                                       beta[start:end], initial)
    return out.to(dtype)


def recurrent_step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                   state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One token of each of N sequences (HF's recurrent form): q, k [N, H, Dk], v [N, H, Dv], g, beta [N, H],
    state [N, H, Dk, Dv] (updated in place and returned) -> (out [N, H, Dv], state).

    HF multiplies and sums elementwise, making four state-sized temporaries; here the decay and the write
    update the state in place and its two reads (k^T S, q^T S) are batched matmuls: 4.5x faster for 8
    sequences of 16 heads of 128 x 128 on 2 cores (8.9 -> 2.0 ms a layer), within 1e-7 of HF's sums."""
    q, k = l2norm(q), l2norm(k)
    q = q / (q.shape[-1] ** 0.5)
    num_seqs, num_heads, key_dim, value_dim = state.shape
    flat = state.view(num_seqs * num_heads, key_dim, value_dim)
    flat.mul_(g.exp().reshape(-1, 1, 1))
    remembered = torch.bmm(k.reshape(-1, 1, key_dim), flat).view(num_seqs, num_heads, value_dim)
    delta = (v - remembered) * beta.unsqueeze(-1)
    flat.baddbmm_(k.reshape(-1, key_dim, 1), delta.reshape(-1, 1, value_dim))
    return torch.bmm(q.reshape(-1, 1, key_dim), flat).view(num_seqs, num_heads, value_dim), state


def chunked_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                 initial: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence's L tokens in chunks of 64 (HF's chunked form): q, k [L, H, Dk], v [L, H, Dv], g, beta
    [L, H], initial [H, Dk, Dv] or None (zeros) -> (out [L, H, Dv], the final state [H, Dk, Dv]).

    Within a chunk the L rank-one updates are one triangular solve (the UT transform): with A the strictly
    lower part of (beta k) k^T weighted by the decay between positions, (I + A) u = beta v gives the values
    actually written and (I + A) w = beta k exp(cumulative g) the keys that read the state at the chunk's start.
    """
    length, num_heads, key_dim = k.shape
    q, k = l2norm(q), l2norm(k)
    q = q * key_dim**-0.5
    # [L, H, D] -> [H, L, D], padded to whole chunks
    pad = (CHUNK_SIZE - length % CHUNK_SIZE) % CHUNK_SIZE
    q, k, v = (F.pad(x.transpose(0, 1), (0, 0, 0, pad)) for x in (q, k, v))
    beta, g = (F.pad(x.transpose(0, 1), (0, pad)) for x in (beta, g))
    v_beta, k_beta = v * beta.unsqueeze(-1), k * beta.unsqueeze(-1)
    q, k, k_beta, v_beta = (x.reshape(num_heads, -1, CHUNK_SIZE, x.shape[-1]) for x in (q, k, k_beta, v_beta))
    decay = g.reshape(num_heads, -1, CHUNK_SIZE).cumsum(dim=-1)  # log decay from the chunk's start
    upper = torch.ones(CHUNK_SIZE, CHUNK_SIZE, dtype=torch.bool, device=q.device).triu(1)
    pairwise = _exp((decay.unsqueeze(-1) - decay.unsqueeze(-2)).masked_fill(upper, float("-inf")))
    system = (k_beta @ k.transpose(-1, -2)) * pairwise
    intra = (q @ k.transpose(-1, -2)) * pairwise
    values = torch.linalg.solve_triangular(system, v_beta, upper=False, unitriangular=True)
    keys_cumdecay = torch.linalg.solve_triangular(system, k_beta * _exp(decay).unsqueeze(-1), upper=False,
                                                  unitriangular=True)
    state = (torch.zeros(num_heads, key_dim, v.shape[-1], dtype=torch.float32, device=v.device)
             if initial is None else initial.float())
    out = torch.zeros_like(values)
    q = q * _exp(decay).unsqueeze(-1)
    k = k * _exp(decay[..., -1:] - decay).unsqueeze(-1)
    chunk_decay = _exp(decay[..., -1])[..., None, None]
    for i in range(values.shape[1]):
        written = values[:, i] - keys_cumdecay[:, i] @ state
        out[:, i] = q[:, i] @ state + intra[:, i] @ written
        state = state * chunk_decay[:, i] + k[:, i].transpose(-1, -2) @ written
    return out.reshape(num_heads, -1, v.shape[-1])[:, :length].transpose(0, 1), state
