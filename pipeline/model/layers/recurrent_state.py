"""The per-sequence state of linear-attention layers (gated DeltaNet: Qwen3-Next, Qwen3.5): a pool of
slots, and what one step needs to read and write them.

Each layer with a state holds, per slot, the last `conv_kernel - 1` inputs of its causal depthwise
convolution ([slots, kernel - 1, conv_channels], in the model's dtype, as HF keeps its conv state) and its
recurrent state ([slots, heads, key_dim, value_dim], float32, as HF keeps it). A sequence's slot is its row
in tensor prep's persistent batch (StepInputs.state_slots): taken when the sequence is scheduled as new,
given back when it finishes or is preempted, so the pool has max_num_seqs slots. A chunk that starts at
position 0 starts from a zero state; any other chunk continues its slot's state, which must end exactly
where the chunk starts: the pool checks that every step (a prefix-cache hit, a fork sharing a slot or a
rejected draft would each break it; the engine keeps all three away from these models).

Worked example of a step's convolution rows (kernel 4, so 3 kept inputs per slot): two sequences, the first
continuing with 2 tokens, the second fresh with 1. The layer convolves over cat(windows, x): rows 0-2 are
the first slot's kept inputs, 3-5 the second's (zeroed: fresh), 6-7 the first sequence's tokens, 8 the
second's. conv_rows [[1, 2, 6, ...]]: token 0 of the first sequence reads rows 0 1 2 6, token 1 rows 1 2 6 7,
the second sequence's token rows 3 4 5 8; each slot keeps the last 3 of its rows: [2, 6, 7] and [4, 5, 8].
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True, slots=True)
class RecurrentStateShape:
    """What a model's state layers keep per sequence."""

    num_layers: int  # layers with a state (the linear-attention ones)
    conv_channels: int
    conv_kernel: int
    num_heads: int  # value heads of the recurrent state
    key_dim: int
    value_dim: int

    def slot_bytes(self, dtype: torch.dtype) -> int:
        """Bytes one sequence's state takes over all state layers."""
        conv = (self.conv_kernel - 1) * self.conv_channels * torch.empty(0, dtype=dtype).element_size()
        recurrent = self.num_heads * self.key_dim * self.value_dim * 4
        return self.num_layers * (conv + recurrent)


@dataclass(slots=True)
class StateStep:
    """One step's view of the pool, shared by every state layer (built once per step)."""

    conv: list[torch.Tensor]  # per state layer: [slots, kernel - 1, channels]
    recurrent: list[torch.Tensor]  # per state layer: [slots, heads, key_dim, value_dim] float32
    num_tokens: int  # the step's real tokens (rows past them are graph padding)
    slots: torch.Tensor  # [B] int64: each sequence's slot
    fresh: torch.Tensor  # [B] bool: the sequence starts at position 0 (zero state)
    conv_rows: torch.Tensor  # [num_tokens, kernel] rows of cat(windows, x) each token's convolution reads
    conv_keep: torch.Tensor  # [B, kernel - 1] rows each slot keeps
    decode_seqs: torch.Tensor  # [D] int64: the sequences with one token this step
    decode_tokens: torch.Tensor  # [D] int64: their token rows
    prefills: list[tuple[int, int, int, bool]]  # (first token, end, slot, fresh) of longer chunks, host ints


class RecurrentStatePool:
    """Every state layer's conv windows and recurrent states, one slot per persistent-batch row."""

    def __init__(self, shape: RecurrentStateShape, num_slots: int, dtype: torch.dtype, device: torch.device,
                 zeros: Callable[[tuple[int, ...], torch.dtype], torch.Tensor] | None = None) -> None:
        """`zeros(shape, dtype)`: how to allocate a zero tensor (the runner's lazily paged one on CPU)."""
        make = zeros or (lambda size, kind: torch.zeros(size, dtype=kind, device=device))
        self.shape, self.num_slots = shape, num_slots
        self.conv = [make((num_slots, shape.conv_kernel - 1, shape.conv_channels), dtype)
                     for _ in range(shape.num_layers)]
        self.recurrent = [make((num_slots, shape.num_heads, shape.key_dim, shape.value_dim), torch.float32)
                          for _ in range(shape.num_layers)]
        self.device = device
        # The position each slot's state has reached: a chunk must start there (or at 0).
        self.next_position = np.zeros(num_slots, np.int64)

    @property
    def num_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.conv, *self.recurrent))

    def step(self, positions: np.ndarray, query_start_loc: np.ndarray, seq_lens: np.ndarray,
             slots: np.ndarray | None) -> StateStep:
        """The step's StateStep from its StepInputs arrays; RuntimeError when a chunk does not continue
        its slot's state."""
        if slots is None:
            raise ValueError("this model keeps a recurrent state per sequence: each step needs its sequences' "
                             "state slots (StepInputs.state_slots)")
        starts = query_start_loc[:-1].astype(np.int64)
        lens = np.diff(query_start_loc).astype(np.int64)
        slots = slots.astype(np.int64)
        first_positions = positions[starts].astype(np.int64)
        fresh = first_positions == 0
        broken = np.flatnonzero(~fresh & (first_positions != self.next_position[slots]))
        if len(broken):
            b = int(broken[0])
            raise RuntimeError(f"state slot {int(slots[b])} holds a sequence's state up to position "
                               f"{int(self.next_position[slots[b]])}, but the step continues it at "
                               f"{int(first_positions[b])}")
        self.next_position[slots] = seq_lens.astype(np.int64)
        rows, keep = _conv_rows(starts, lens, self.shape.conv_kernel)
        decode_seqs = np.flatnonzero(lens == 1)
        prefills = [(int(starts[b]), int(starts[b] + lens[b]), int(slots[b]), bool(fresh[b]))
                    for b in np.flatnonzero(lens > 1)]
        device = self.device
        return StateStep(self.conv, self.recurrent, int(query_start_loc[-1]), _tensor(slots, device),
                         _tensor(fresh, device), _tensor(rows, device), _tensor(keep, device),
                         _tensor(decode_seqs, device), _tensor(starts[decode_seqs], device), prefills)


def _conv_rows(starts: np.ndarray, lens: np.ndarray, kernel: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows of cat(windows [B * (kernel - 1)], x [T]) each token's convolution reads, and each slot keeps
    (module docstring). Relative position r of sequence b (its first token at r = 0) is x row
    B * (kernel - 1) + starts[b] + r for r >= 0, and window row b * (kernel - 1) + (kernel - 1) + r before."""
    width = kernel - 1
    num_seqs, num_tokens = len(lens), int(lens.sum())
    owner = np.repeat(np.arange(num_seqs), lens)
    within = np.arange(num_tokens) - np.repeat(np.cumsum(lens) - lens, lens)
    relative = within[:, None] - width + np.arange(kernel)[None, :]  # [T, kernel]
    rows = _row_of(owner[:, None], relative, starts, width, num_seqs)
    kept = lens[:, None] - width + np.arange(width)[None, :]  # [B, kernel - 1]
    keep = _row_of(np.arange(num_seqs)[:, None], kept, starts, width, num_seqs)
    return rows, keep


def _row_of(seq: np.ndarray, relative: np.ndarray, starts: np.ndarray, width: int, num_seqs: int) -> np.ndarray:
    return np.where(relative >= 0, num_seqs * width + starts[seq] + relative, seq * width + width + relative)


def _tensor(array: np.ndarray, device: torch.device) -> torch.Tensor:
    tensor = torch.from_numpy(np.ascontiguousarray(array))
    return tensor if device.type != "cuda" else tensor.pin_memory().to(device, non_blocking=True)
