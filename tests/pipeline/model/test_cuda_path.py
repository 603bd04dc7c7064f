"""The CUDA path: graph buffers and memory-sizing arithmetic on CPU; graph replay, profiling and
host syncs on CUDA only (skipped without a GPU; benchmarks/gpu_check.sh runs them on one)."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from pipeline.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from pipeline.engine import LLMEngine
from pipeline.model.attention.flex import FlexPagedAttention
from pipeline.model.attention.flex_graphs import FlexDecodeBuffers
from pipeline.model.memory_profile import MemoryProfile, sampler_reserve
from pipeline.model.runner import ModelRunner
from pipeline.request.sampling_params import SamplingParams
from pipeline.step.inputs import StepInputs
from tests.support.hf_models import make_tiny_hf_model

cuda_only = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
GiB = 2**30


def test_kv_budget_is_the_utilization_share_minus_everything_else() -> None:
    profile = MemoryProfile(total_bytes=100 * GiB, others_bytes=1 * GiB, step_peak_bytes=5 * GiB,
                            graph_reserve_bytes=GiB // 2, sampler_reserve_bytes=GiB // 2)
    assert profile.kv_cache_bytes(0.9) == 90 * GiB - 7 * GiB
    # 8 float32 copies of [256, 151936] logits
    assert sampler_reserve(256, 151936) == 8 * 256 * 151936 * 4


def test_flex_graph_buffers_pad_rows_visit_nothing_and_write_the_scratch_slot() -> None:
    backend = FlexPagedAttention(4, 2, 16, block_size=4, scale=1.0, windows=frozenset({None, 5}))
    buffers = FlexDecodeBuffers(backend, max_num_seqs=8, max_blocks_per_seq=6, num_cache_blocks=20,
                                scratch_slot=80, device=torch.device("cpu"))
    # Two decodes: lengths 10 (blocks 7, 3, 9) and 3 (block 5); the second's slot is 5 * 4 + 2.
    inputs = StepInputs(input_ids=np.array([11, 12]), positions=np.array([9, 2]), slot_mapping=np.array([37, 22]),
                        query_start_loc=np.array([0, 1, 2], np.int32), seq_lens=np.array([10, 3], np.int32),
                        block_tables=np.array([[7, 3, 9], [5, 0, 0]], np.int32), logits_indices=np.array([0, 1]),
                        num_tokens=2, max_query_len=1, max_seq_len=10)
    buffers.fill(inputs, size=4)
    assert buffers.slot_mapping[:4].tolist() == [37, 22, 80, 80]
    assert buffers.kv_num_blocks[None][:4].tolist() == [3, 1, 0, 0]
    assert buffers.kv_indices[None][0, :3].tolist() == [7, 3, 9]
    # window 5: the query at 9 sees 5..9 -> blocks 1 and 2 only
    assert buffers.kv_num_blocks[5][:2].tolist() == [2, 1]
    assert buffers.kv_indices[5][0, :2].tolist() == [3, 9]
    assert buffers.query_starts[None][:2].tolist() == [9, 2]
    assert backend.block_positions[[7, 3, 9, 5]].tolist() == [0, 1, 2, 0]


def _cuda_engine(path: Path, **model: object) -> LLMEngine:
    return LLMEngine(EngineConfig(model=ModelConfig(model=str(path), device="cuda", **model),
                                  cache=CacheConfig(block_size=16, gpu_memory_utilization=0.3),
                                  scheduler=SchedulerConfig(max_num_batched_tokens=512, max_num_seqs=16)))


@pytest.mark.gpu
@cuda_only
def test_profiled_cache_stays_within_the_utilization_share(tmp_path: Path) -> None:
    path = make_tiny_hf_model("qwen3", tmp_path / "m")
    runner = ModelRunner(ModelConfig(quantization="none", device="cuda", dtype="bfloat16"),
                         CacheConfig(gpu_memory_utilization=0.3),
                         SchedulerConfig(max_num_batched_tokens=2048, max_num_seqs=64), str(path))
    free, total = torch.cuda.mem_get_info()
    assert runner.num_kv_blocks > 0 and runner.graph_runner is not None
    assert total - free <= 0.3 * total + 256 * 2**20  # the share, plus what other tests' processes left


@pytest.mark.gpu
@cuda_only
def test_graph_decode_steps_sync_with_the_host_once(tmp_path: Path) -> None:
    path = make_tiny_hf_model("llama", tmp_path / "m")
    engine = _cuda_engine(path, dtype="float32")
    for index in range(4):
        engine.add_request(f"r{index}", list(range(3, 40 + index)), SamplingParams(max_tokens=12, temperature=0.0,
                                                                                   ignore_eos=True))
    engine.step()  # the prefill
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            engine.step()  # a decode step through a graph
    finally:
        torch.cuda.set_sync_debug_mode("default")
    syncs = [w for w in caught if "synchroniz" in str(w.message)]
    assert len(syncs) <= 1, [str(w.message) for w in syncs]
