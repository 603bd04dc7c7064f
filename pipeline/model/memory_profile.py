"""Sizing the KV cache on CUDA from --gpu-memory-utilization (the budget is a share of the whole card).

    kv bytes = utilization * total
               - memory others hold (CUDA context, other processes: what torch has not reserved)
               - peak of a max-size step (weights + activations of max_num_batched_tokens tokens,
                 logits of max_num_seqs rows and the sampler's copies of them)
               - graph reserve (the CUDA graphs' shared pool: activations of the largest decode batch)

The step peak is measured (torch.cuda.max_memory_allocated around a dummy prefill of the full
token budget, then a dummy max-batch decode whose peak stands for the graph pool); the sampler's
working set is estimated as SAMPLER_COPIES float32 copies of the [max_num_seqs, vocab] logits
(its stages each make at most a few; it does not run during profiling).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import structlog
import torch

log = structlog.get_logger(__name__)

SAMPLER_COPIES = 8


@dataclass(frozen=True, slots=True)
class MemoryProfile:
    total_bytes: int
    others_bytes: int  # held outside torch's allocator (context, other processes)
    step_peak_bytes: int  # weights + the largest step's activations and logits
    graph_reserve_bytes: int
    sampler_reserve_bytes: int

    def kv_cache_bytes(self, utilization: float) -> int:
        budget = int(utilization * self.total_bytes)
        return budget - self.others_bytes - self.step_peak_bytes - self.graph_reserve_bytes - \
            self.sampler_reserve_bytes


def sampler_reserve(max_num_seqs: int, vocab_size: int) -> int:
    return SAMPLER_COPIES * max_num_seqs * vocab_size * 4


def profile_memory(device: torch.device, run_max_prefill: Callable[[], None], run_max_decode: Callable[[], None],
                   max_num_seqs: int, vocab_size: int, use_graphs: bool) -> MemoryProfile:
    """Run the two dummy steps and read the allocator's peaks (weights already loaded)."""
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info(device)
    others = (total - free) - torch.cuda.memory_reserved(device)
    torch.cuda.reset_peak_memory_stats(device)
    run_max_prefill()
    torch.cuda.synchronize(device)
    step_peak = torch.cuda.max_memory_allocated(device)
    graph_reserve = 0
    if use_graphs:
        resident = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        run_max_decode()
        torch.cuda.synchronize(device)
        graph_reserve = torch.cuda.max_memory_allocated(device) - resident
    torch.cuda.empty_cache()
    profile = MemoryProfile(total, max(others, 0), step_peak, graph_reserve, sampler_reserve(max_num_seqs, vocab_size))
    log.info("profiled memory", total_bytes=total, others_bytes=profile.others_bytes, step_peak_bytes=step_peak,
             graph_reserve_bytes=graph_reserve, sampler_reserve_bytes=profile.sampler_reserve_bytes)
    return profile
