"""FlexPagedAttention (torch FlexAttention over the paged cache) equals the portable torch backend
and HF transformers on CPU: decode, chunked prefill over cached context, mixed steps with padding,
GQA, sliding windows and soft-capping.

torch.compile builds a CPU kernel per shape on first use (20-40 s each on a 2-core box), so one
representative mixed step runs by default; the rest are marked slow and run with
AQUEDUCT_SLOW_TESTS=1 (benchmarks/gpu_check.sh runs them all on CUDA).
"""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from pipeline.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from pipeline.engine import LLMEngine
from pipeline.model.attention.flex import FlexPagedAttention
from pipeline.model.attention.flex_plan import decode_plan, prefill_plan
from pipeline.model.attention.paged import TorchPagedAttention
from pipeline.model.attention.windows import Chunk, Window
from pipeline.model.graphs import CUDAGraphRunner
from pipeline.model.runner import ModelRunner
from pipeline.request.sampling_params import SamplingParams
from pipeline.step.inputs import StepInputs
from tests.pipeline.model.test_model_forward import ATOL, Reference, Seqs, run_and_check
from tests.support.engine_helpers import assert_greedy_equal, hf_greedy, run_requests
from tests.support.hf_models import make_tiny_hf_model

NUM_BLOCKS = 48
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# torch.compile builds CPU kernels with a C++ compiler (inductor's default: g++, or $CXX).
needs_cxx = pytest.mark.skipif(DEVICE == "cpu" and not (os.environ.get("CXX") or shutil.which("g++")),
                               reason="FlexAttention on CPU needs a C++ compiler for torch.compile")
_slow_on_cpu = pytest.mark.skipif(os.environ.get("AQUEDUCT_SLOW_TESTS") != "1" and DEVICE == "cpu",
                                  reason="compiles many CPU kernels (minutes); set AQUEDUCT_SLOW_TESTS=1")


def slow(test):  # marked slow, and skipped on the CPU unless asked for
    return pytest.mark.slow(_slow_on_cpu(test))


def test_decode_plan_lists_blocks_from_the_window_start() -> None:
    tables = np.array([[7, 2, 9, 5], [4, 6, 0, 0]])
    plan = decode_plan(np.array([0, 1]), np.array([13, 3]), tables, block_size=4, window=6)
    # sequence 0: query at 12 sees 7..12 -> blocks 1..3; sequence 1: query at 2 sees 0..2 -> block 0
    assert plan.kv_num_blocks.tolist() == [3, 1]
    assert plan.kv_indices.tolist() == [[2, 9, 5], [4, 0, 0]]
    assert plan.visited_blocks.tolist() == [2, 9, 5, 4] and plan.visited_positions.tolist() == [1, 2, 3, 0]
    assert plan.query_starts.tolist() == [12, 2]


def test_prefill_plan_cuts_tiles_and_drops_pad_rows() -> None:
    tables = np.arange(8).reshape(2, 4)
    plan = prefill_plan(np.array([0, 9]), np.array([9, 3]), np.array([9, 7]), tables, block_size=4,
                        window=None, tile=4)
    assert plan.token_rows.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 8, 8, 8], [9, 10, 11, 11]]
    assert plan.query_starts.tolist() == [0, 4, 8, 4]
    assert plan.kv_num_blocks.tolist() == [1, 2, 3, 2]  # up to each tile's last query
    assert plan.out_dst.tolist() == list(range(12))
    assert plan.out_src.tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 8, 12, 13, 14]


def _random_step(rng: np.random.Generator, block_size: int, chunks: list[tuple[int, int]],
                 num_padding: int) -> StepInputs:
    """chunks: (cached context, new tokens) per sequence, blocks drawn without repeats."""
    free = list(rng.permutation(NUM_BLOCKS))
    ids, positions, slots, query_lens, seq_lens, tables = [], [], [], [], [], []
    for context, new in chunks:
        table = [int(free.pop()) for _ in range(-(-(context + new) // block_size))]
        pos = np.arange(context, context + new)
        ids += [0] * new
        positions += pos.tolist()
        slots += (np.array(table)[pos // block_size] * block_size + pos % block_size).tolist()
        query_lens.append(new)
        seq_lens.append(context + new)
        tables.append(table)
    width = max(len(t) for t in tables)
    block_tables = np.zeros((len(chunks), width), dtype=np.int32)
    for row, table in enumerate(tables):
        block_tables[row, :len(table)] = table
    total = len(ids)
    query_start_loc = np.concatenate([[0], np.cumsum(query_lens)]).astype(np.int32)
    return StepInputs(np.zeros(total + num_padding, np.int64), np.array(positions + [0] * num_padding),
                      np.array(slots + [-1] * num_padding), query_start_loc,
                      np.array(seq_lens, np.int32), block_tables, np.arange(total), total, max(query_lens),
                      max(seq_lens))


MIXED_STEP = ([(13, 1), (6, 11), (2, 1), (30, 3)], 2)  # chunks over cached context, decodes, padding
ALL_STEPS = (([(5, 1), (12, 1), (0, 1)], 0), ([(0, 9), (0, 70)], 0), MIXED_STEP)


def _compare_backends(heads: tuple[int, int], windows: frozenset[Window], softcap: float | None,
                      steps: tuple[tuple[list[tuple[int, int]], int], ...]) -> None:
    num_heads, num_kv_heads = heads
    head_dim, block_size = 16, 4
    device = torch.device(DEVICE)
    rng = np.random.default_rng(0)
    args = (num_heads, num_kv_heads, head_dim, block_size, 0.3)
    flex = FlexPagedAttention(*args, windows=windows, logit_softcap=softcap)
    reference = TorchPagedAttention(*args, windows=windows, logit_softcap=softcap)
    cache = torch.randn(2, NUM_BLOCKS, block_size, num_kv_heads, head_dim, device=device)
    for chunks, padding in steps:
        inputs = _random_step(rng, block_size, chunks, padding)
        tokens = len(inputs.input_ids)
        q = torch.randn(tokens, num_heads, head_dim, device=device)
        k, v = (torch.randn(tokens, num_kv_heads, head_dim, device=device) for _ in range(2))
        for layer_window in windows:
            flex_cache, reference_cache = cache.clone(), cache.clone()
            got = flex.forward(q, k, v, flex_cache, flex.build_metadata(inputs, device), layer_window)
            want = reference.forward(q, k, v, reference_cache, reference.build_metadata(inputs, device),
                                     layer_window)
            real = inputs.num_tokens
            torch.testing.assert_close(got[:real], want[:real], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(flex_cache, reference_cache)


@needs_cxx
def test_flex_matches_torch_backend_on_a_mixed_windowed_softcapped_gqa_step() -> None:
    _compare_backends((4, 2), frozenset({7}), 10.0, (MIXED_STEP,))


@slow
@needs_cxx
@pytest.mark.parametrize(("heads", "window", "softcap"), [((4, 2), None, None), ((4, 1), 7, None),
                                                          ((2, 2), 5, 10.0)])
def test_flex_matches_torch_backend_on_every_step_kind(heads: tuple[int, int], window: int | None,
                                                       softcap: float | None) -> None:
    _compare_backends(heads, frozenset({None, window}), softcap, ALL_STEPS)


@slow
@needs_cxx
def test_flex_matches_torch_backend_on_chunked_layers() -> None:
    """Llama 4's chunks (attention/windows.py) beside full-attention layers, on every step kind."""
    _compare_backends((4, 2), frozenset({None, Chunk(6)}), None, ALL_STEPS)


def _flex_runner(path: Path, block_size: int) -> ModelRunner:
    return ModelRunner(ModelConfig(quantization="none", device=DEVICE, dtype="float32", attention_backend="flex",
                                   enforce_eager=True),
                       CacheConfig(block_size=block_size, num_kv_blocks=256), SchedulerConfig(), str(path))


@slow
@needs_cxx
@pytest.mark.parametrize("arch", ["gemma2", "gemma3", "gemma4", "qwen3", "mistral", "llama4"])
def test_flex_runner_logits_match_hf(arch: str, tmp_path: Path) -> None:
    """Chunked prefill over cached context, decodes, a mixed step, then decodes through the
    CUDA-graph buffers (replayed on CUDA, called eagerly on CPU)."""
    path = make_tiny_hf_model(arch, tmp_path / arch)
    ref = Reference(path, AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval())
    runner = _flex_runner(path, block_size=4)
    seqs = Seqs(runner.block_size, seed=3)
    first, second = seqs.add(41), seqs.add(9)
    run_and_check(runner, seqs, ref, [(first, 13), (second, 9)])
    seqs.append_token(second)
    run_and_check(runner, seqs, ref, [(first, 28), (second, 1)], num_padding=3)
    runner.kv_caches = [torch.cat([c, torch.zeros_like(c[:, :1])], dim=1) for c in runner.kv_caches]
    with torch.inference_mode():  # as the runner captures
        graphs = CUDAGraphRunner(runner.model, runner.backend, runner.kv_caches, max_num_seqs=4,
                                 max_blocks_per_seq=32, scratch_slot=256 * 4, device=runner.device,
                                 capture=DEVICE == "cuda")
    for _ in range(3):
        for seq in (first, second):
            seqs.append_token(seq)
        chunks = [(first, 1), (second, 1)]
        inputs = seqs.step(chunks)
        assert graphs.can_run(inputs)
        with torch.inference_mode():
            logits = runner.model.compute_logits(graphs.run(inputs))
        torch.testing.assert_close(logits.cpu(), seqs.expected(ref, chunks), atol=ATOL, rtol=0)


@slow
@needs_cxx
def test_flex_engine_greedy_matches_hf_with_window_chunks_and_prefix_hits(tmp_path: Path) -> None:
    path = make_tiny_hf_model("mistral", tmp_path / "mistral", seed=5, sliding_window=21)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    engine = LLMEngine(EngineConfig(
        model=ModelConfig(quantization="none", model=str(path), device=DEVICE, dtype="float32",
                          attention_backend="flex"),
        cache=CacheConfig(block_size=4, num_kv_blocks=36),
        scheduler=SchedulerConfig(max_num_batched_tokens=20, max_num_seqs=6)))
    rng = random.Random(2)
    shared = [rng.randrange(3, 512) for _ in range(30)]
    requests = {f"r{i}": ([*shared, *(rng.randrange(3, 512) for _ in range(rng.randint(1, 40)))],
                          SamplingParams(max_tokens=rng.randint(4, 30), temperature=0.0, ignore_eos=True))
                for i in range(8)}
    results = run_requests(engine, requests)
    assert sum(r["usage"].cached_tokens for r in results.values()) > 0
    for request_id, (prompt, params) in requests.items():
        theirs, logits = hf_greedy(hf, prompt, params.max_tokens)
        assert_greedy_equal(results[request_id]["choices"][0]["token_ids"], theirs, logits, request_id)
