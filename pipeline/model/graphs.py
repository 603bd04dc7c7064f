"""CUDA-graph replay for decode-only steps (every sequence contributes exactly one token).

The padding and static-buffer logic runs on CPU with `capture=False` (the same code path, called
eagerly instead of replayed); the capture itself (torch.cuda.graph, shared pool, largest size
first) is covered by CUDA-only tests (tests/pipeline/model/test_cuda_path.py, skipped without a GPU).

Graphs are captured for batch sizes 1, 2, 4, 8, 16, 24, 32, ... (step 8) up to max_num_seqs,
largest first so smaller graphs reuse the one memory pool. A real batch of B sequences is padded
to the next captured size: pad rows write their K/V to a scratch slot the runner reserves and
read nothing a real sequence wrote. The attention metadata of a replay lives in static buffers
the backend defines:
- FlexPagedAttention (the CUDA default, flex_graphs.py): per sequence the list of its own blocks;
  the kernel reads only those.
- TorchPagedAttention (TorchDecodeBuffers below): a fixed number of blocks per sequence (the
  whole max_model_len) gathered and masked: capturable, but every step gathers max_model_len
  keys per sequence.
"""

from __future__ import annotations

import numpy as np
import structlog
import torch

from pipeline.host_to_device import to_device
from pipeline.model.attention.flex import FlexPagedAttention
from pipeline.model.attention.flex_graphs import FlexDecodeBuffers
from pipeline.model.attention.groups import TorchAttentionMetadata
from pipeline.model.attention.paged import TorchPagedAttention
from pipeline.step.inputs import StepInputs

log = structlog.get_logger(__name__)


def capture_sizes(max_num_seqs: int) -> list[int]:
    """[1, 2, 4, 8, 16, 24, ...] up to and including max_num_seqs, largest first.

    max_num_seqs 20 -> [20, 16, 8, 4, 2, 1]
    """
    sizes = {size for size in (1, 2, 4) if size <= max_num_seqs}
    sizes.update(range(8, max_num_seqs + 1, 8))
    sizes.add(max_num_seqs)
    return sorted(sizes, reverse=True)


class TorchDecodeBuffers:
    """Static inputs of TorchPagedAttention.static_decode_metadata: seq lens and whole block tables."""

    def __init__(self, backend: TorchPagedAttention, max_num_seqs: int, max_blocks_per_seq: int,
                 scratch_slot: int, device: torch.device) -> None:
        self.backend = backend
        self.max_blocks_per_seq = max_blocks_per_seq
        self.scratch_slot = scratch_slot
        self.slot_mapping = torch.full((max_num_seqs,), scratch_slot, dtype=torch.long, device=device)
        self.seq_lens = torch.ones(max_num_seqs, dtype=torch.long, device=device)
        self.block_tables = torch.zeros(max_num_seqs, max_blocks_per_seq, dtype=torch.long, device=device)

    def fits(self, inputs: StepInputs) -> bool:
        return int(inputs.seq_lens.max()) <= self.max_blocks_per_seq * self.backend.block_size

    def metadata(self, size: int) -> TorchAttentionMetadata:
        return self.backend.static_decode_metadata(self.slot_mapping[:size], self.seq_lens[:size],
                                                   self.block_tables[:size])

    def fill(self, inputs: StepInputs, size: int) -> None:
        num_seqs = inputs.num_seqs
        width = min(inputs.block_tables.shape[1], self.max_blocks_per_seq)
        slots = inputs.slot_mapping[:num_seqs].astype(np.int64)
        _copy(self.slot_mapping, np.where(slots < 0, self.scratch_slot, slots), size, self.scratch_slot)
        _copy(self.seq_lens, inputs.seq_lens.astype(np.int64), size, 1)
        self.block_tables[:size].zero_()
        # Entries of blocks freed outside a sliding window are -1; the static path reads every block
        # (then masks those), so point them at block 0.
        self.block_tables[:num_seqs, :width].copy_(
            torch.from_numpy(np.maximum(inputs.block_tables[:, :width], 0).astype(np.int64)))


def _copy(dst: torch.Tensor, src: np.ndarray, size: int, pad: int) -> None:
    dst[: len(src)].copy_(to_device(src, dst.device, dst.dtype))
    dst[len(src):size].fill_(pad)


class CUDAGraphRunner:
    def __init__(self, model: torch.nn.Module, backend: TorchPagedAttention | FlexPagedAttention,
                 kv_caches: list[torch.Tensor], max_num_seqs: int, max_blocks_per_seq: int, scratch_slot: int,
                 device: torch.device, capture: bool = True) -> None:
        self.model, self.backend, self.kv_caches = model, backend, kv_caches
        self.sizes = capture_sizes(max_num_seqs)
        self.use_graphs = capture
        size = self.sizes[0]
        if isinstance(backend, FlexPagedAttention):
            self.buffers: FlexDecodeBuffers | TorchDecodeBuffers = FlexDecodeBuffers(
                backend, size, max_blocks_per_seq, kv_caches[0].shape[1], scratch_slot, device)
        else:
            self.buffers = TorchDecodeBuffers(backend, size, max_blocks_per_seq, scratch_slot, device)
        self.input_ids = torch.zeros(size, dtype=torch.long, device=device)
        self.positions = torch.zeros(size, dtype=torch.long, device=device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        if capture:
            self._capture_all()

    def _forward(self, size: int) -> torch.Tensor:
        metadata = self.buffers.metadata(size)
        return self.model(self.input_ids[:size], self.positions[:size], metadata, self.kv_caches)

    def _capture_all(self) -> None:
        pool = torch.cuda.graph_pool_handle()
        for size in self.sizes:  # largest first: later graphs fit in the pool it reserved
            self._forward(size)  # warm up kernels (and torch.compile) and the allocator outside the capture
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.outputs[size] = self._forward(size)
            self.graphs[size] = graph
        torch.cuda.synchronize()
        log.info("cuda graphs captured", sizes=self.sizes, backend=type(self.backend).__name__)

    def can_run(self, inputs: StepInputs) -> bool:
        num_seqs = inputs.num_seqs
        return (inputs.max_query_len == 1 and inputs.num_tokens == num_seqs and 0 < num_seqs <= self.sizes[0]
                and self.buffers.fits(inputs))

    def run(self, inputs: StepInputs) -> torch.Tensor:
        """Hidden states [num_seqs, hidden] of a decode-only step."""
        num_seqs = inputs.num_seqs
        size = min(s for s in self.sizes if s >= num_seqs)
        self._fill(inputs, size)
        if not self.use_graphs:
            return self._forward(size)[:num_seqs]
        self.graphs[size].replay()
        return self.outputs[size][:num_seqs]

    def _fill(self, inputs: StepInputs, size: int) -> None:
        num_seqs = inputs.num_seqs
        _copy(self.input_ids, inputs.input_ids[:num_seqs].astype(np.int64), size, 0)
        _copy(self.positions, inputs.positions[:num_seqs].astype(np.int64), size, 0)
        self.buffers.fill(inputs, size)
