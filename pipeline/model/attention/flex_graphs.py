"""Static decode buffers for CUDA-graph replay of FlexPagedAttention.

A captured graph reads fixed addresses, so everything a decode step's attention needs lives in
buffers sized for the largest captured batch, refilled before each replay from the same numpy
plan the eager path uses (flex_plan.decode_plan): per window the blocks each sequence visits
(kv_indices, max_blocks_per_seq wide), their count and each query's position; the backend's
block-position table is updated in place. Pad rows of a captured size visit no blocks and write
their K/V to the runner's scratch slot. Host arrays are staged in pinned memory (on CUDA) and
copied without blocking, so filling costs no host sync.
"""

from __future__ import annotations

import numpy as np
import torch

from pipeline.model.attention.flex import FlexAttentionMetadata, FlexPagedAttention, FlexPass
from pipeline.model.attention.flex_plan import decode_plan
from pipeline.step.inputs import StepInputs


def _staged(array: np.ndarray, dtype: torch.dtype, pin: bool) -> torch.Tensor:
    tensor = torch.from_numpy(np.ascontiguousarray(array)).to(dtype)
    return tensor.pin_memory() if pin else tensor


class FlexDecodeBuffers:
    def __init__(self, backend: FlexPagedAttention, max_num_seqs: int, max_blocks_per_seq: int,
                 num_cache_blocks: int, scratch_slot: int, device: torch.device) -> None:
        self.backend = backend
        self.scratch_slot = scratch_slot
        self.num_cache_blocks = num_cache_blocks
        self.max_blocks_per_seq = max_blocks_per_seq
        self.pin = device.type == "cuda"
        int32 = {"dtype": torch.int32, "device": device}
        self.slot_mapping = torch.full((max_num_seqs,), scratch_slot, dtype=torch.long, device=device)
        self.kv_num_blocks = {w: torch.zeros(max_num_seqs, **int32) for w in backend.windows}
        self.kv_indices = {w: torch.zeros(max_num_seqs, max_blocks_per_seq, **int32) for w in backend.windows}
        self.query_starts = {w: torch.zeros(max_num_seqs, **int32) for w in backend.windows}
        # The table the masks read must exist before capture (the graph holds its address).
        if backend.block_positions.numel() < num_cache_blocks or backend.block_positions.device != device:
            backend.block_positions = torch.zeros(num_cache_blocks, **int32)

    def fits(self, inputs: StepInputs) -> bool:
        return int(inputs.seq_lens.max()) <= self.max_blocks_per_seq * self.backend.block_size

    def fill(self, inputs: StepInputs, size: int) -> None:
        num_seqs = inputs.num_seqs
        slots = inputs.slot_mapping[:num_seqs].astype(np.int64)
        self._copy(self.slot_mapping, np.where(slots < 0, self.scratch_slot, slots), size, self.scratch_slot)
        seq_lens = inputs.seq_lens.astype(np.int64)
        for window in self.backend.windows:
            plan = decode_plan(np.arange(num_seqs), seq_lens, inputs.block_tables, self.backend.block_size, window)
            self._copy(self.kv_num_blocks[window], plan.kv_num_blocks, size, 0)  # pad rows visit nothing
            self._copy(self.query_starts[window], plan.query_starts, size, 0)
            width = plan.kv_indices.shape[1]
            self.kv_indices[window][:num_seqs, :width].copy_(_staged(plan.kv_indices, torch.int32, self.pin),
                                                             non_blocking=True)
            positions = _staged(plan.visited_positions, torch.int32, self.pin)
            blocks = _staged(plan.visited_blocks, torch.long, self.pin)
            self.backend.block_positions.index_copy_(0, blocks.to(self.slot_mapping.device, non_blocking=True),
                                                     positions.to(self.slot_mapping.device, non_blocking=True))

    def _copy(self, dst: torch.Tensor, src: np.ndarray, size: int, pad: int) -> None:
        dst[: len(src)].copy_(_staged(src, dst.dtype, self.pin), non_blocking=True)
        dst[len(src):size].fill_(pad)

    def metadata(self, size: int) -> FlexAttentionMetadata:
        """Decode metadata over the first `size` rows of the buffers (called inside the capture)."""
        passes = {}
        for window in self.backend.windows:
            block_mask = self.backend.block_mask(self.kv_num_blocks[window][:size], self.kv_indices[window][:size],
                                                 self.query_starts[window][:size], window, self.num_cache_blocks, 1)
            rows = torch.arange(size, device=self.slot_mapping.device)
            flex_pass = FlexPass(None, rows, None, None, self.kv_num_blocks[window][:size],  # type: ignore[arg-type]
                                 self.kv_indices[window][:size], self.query_starts[window][:size], window, block_mask)
            passes[window] = (flex_pass, None)
        empty = torch.zeros(0, dtype=torch.long, device=self.slot_mapping.device)
        return FlexAttentionMetadata(self.slot_mapping[:size], None, empty, empty.int(), passes,
                                     all_decode_rows=True, prepared=True)
