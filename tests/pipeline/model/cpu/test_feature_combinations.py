"""CPU decode features together: the native decode kernel on an fp8 cache under a bfloat16 model,
the fused rope + KV write kept off fp8 caches, quantized linears under LoRA, and quantization with
tensor parallelism (not supported: a clear error)."""

from __future__ import annotations

import argparse

import numpy as np
import pytest
import torch

from actors.cli.engine_args import add_engine_args, engine_config_from_args
from pipeline.config import CacheConfig, EngineConfig, LoRAConfig, ModelConfig, SchedulerConfig
from pipeline.engine import LLMEngine
from pipeline.model.attention.fp8_kv import FP8_DTYPES, Fp8KVCache
from pipeline.model.attention.paged import TorchPagedAttention
from pipeline.model.cpu.kernels import RopeKVKernel, load_decode_kernel, load_rope_kv_kernel
from pipeline.model.layers.quantized_linear import Int8Linear, quantized_kernels_work
from pipeline.request.sampling_params import SamplingParams
from pipeline.step.inputs import StepInputs
from tests.support.engine_helpers import hf_greedy, run_requests
from tests.support.fp8_agreement import fixed_prompts, measure_agreement
from tests.support.hf_models import make_tiny_hf_model
from tests.support.lora_adapters import ADAPTER_SPECS, make_adapters, peft_model, run_with_adapters

kernel = load_decode_kernel()
needs_kernels = pytest.mark.skipif(kernel is None or load_rope_kv_kernel() is None, reason="no C compiler")


def _decode_inputs(seq_lens: list[int], block_size: int, blocks_per_seq: int) -> StepInputs:
    """A read-only decode step (no slot written) of sequences whose blocks are seq * blocks_per_seq + 0, 1, ..."""
    num = len(seq_lens)
    tables = (np.arange(num)[:, None] * blocks_per_seq + np.arange(blocks_per_seq)[None, :]).astype(np.int32)
    lens = np.asarray(seq_lens, dtype=np.int32)
    return StepInputs(input_ids=np.zeros(num, dtype=np.int64), positions=(lens - 1).astype(np.int64),
                      slot_mapping=np.full(num, -1, dtype=np.int64),
                      query_start_loc=np.arange(num + 1, dtype=np.int32), seq_lens=lens, block_tables=tables,
                      logits_indices=np.arange(num, dtype=np.int64), num_tokens=num, max_query_len=1,
                      max_seq_len=int(lens.max()))


@needs_kernels
@pytest.mark.parametrize("kv_cache_dtype", ["fp8_e4m3", "fp8_e5m2"])
@pytest.mark.parametrize(("heads", "kv_heads", "head_dim"), [(4, 2, 16), (8, 2, 64), (6, 3, 20)])
def test_kernel_reads_fp8_under_bfloat16_queries(kv_cache_dtype: str, heads: int, kv_heads: int,
                                                 head_dim: int) -> None:
    """bfloat16 q on an fp8 cache: the kernel widens q to float32 and decodes the bytes itself; its
    output is the float32 torch path's (same cache, q widened) rounded to bfloat16."""
    block_size, blocks_per_seq = 4, 5
    generator = torch.Generator().manual_seed(2)
    data = torch.zeros(2, 3 * blocks_per_seq, block_size, kv_heads, head_dim, dtype=FP8_DTYPES[kv_cache_dtype])
    data.copy_((torch.randn(data.shape, generator=generator) * 3).clamp(-400, 400).to(data.dtype))
    cache = Fp8KVCache(data, torch.tensor(0.4), torch.tensor(0.05))
    q = torch.randn(3, heads, head_dim, generator=generator).bfloat16()
    inputs = _decode_inputs([17, 3, 20], block_size, blocks_per_seq)
    torch_path = TorchPagedAttention(heads, kv_heads, head_dim, block_size, scale=head_dim**-0.5)
    kernel_path = TorchPagedAttention(heads, kv_heads, head_dim, block_size, scale=head_dim**-0.5)
    kernel_path.decode_kernel = kernel
    empty = torch.empty(3, kv_heads, head_dim)
    expected = torch_path.forward(q.float(), empty, empty, cache, torch_path.build_metadata(inputs, q.device))
    actual = kernel_path.forward(q, empty, empty, cache, kernel_path.build_metadata(inputs, q.device))
    assert actual.dtype == torch.bfloat16
    torch.testing.assert_close(actual.float(), expected.bfloat16().float(), atol=1e-2, rtol=1e-2)


def _bf16_engine(path, kv_cache_dtype: str) -> LLMEngine:
    return LLMEngine(EngineConfig(
        model=ModelConfig(quantization="none", model=str(path), dtype="bfloat16"),
        cache=CacheConfig(num_kv_blocks=64, kv_cache_dtype=kv_cache_dtype,
                          calculate_kv_scales=kv_cache_dtype != "auto"),
        scheduler=SchedulerConfig(max_num_batched_tokens=512)))


@needs_kernels
def test_fused_rope_write_is_kept_off_fp8_caches(tmp_path, monkeypatch) -> None:
    """bfloat16 model: with a bfloat16 cache the fused rope + KV write runs; with an fp8 cache it
    never does (the quantizing torch write does), while the decode kernel still reads the fp8 bytes
    and stays close to the torch path on the same cache."""
    calls = {"count": 0}
    original = RopeKVKernel.__call__

    def counted(self, *args, **kwargs):
        calls["count"] += 1
        return original(self, *args, **kwargs)

    monkeypatch.setattr(RopeKVKernel, "__call__", counted)
    path = make_tiny_hf_model("llama", tmp_path / "llama")
    plain = _bf16_engine(path, "auto")
    prompts = fixed_prompts(plain.vocab_size, count=3)
    run_requests(plain, {"p": (prompts[0], SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True))})
    assert calls["count"] > 0
    calls["count"] = 0
    reference = _bf16_engine(path, "fp8_e4m3")
    reference.runner.backend.decode_kernel = None  # the torch gather path
    candidate = _bf16_engine(path, "fp8_e4m3")
    assert candidate.runner.backend.decode_kernel is not None
    assert candidate.runner.backend.rope_kv_kernel is not None
    agreement = measure_agreement(reference, candidate, prompts, max_tokens=12)
    assert calls["count"] == 0
    assert agreement.identical_share >= 0.5, agreement
    assert agreement.mean_kl < 0.01, agreement


def test_quantization_with_tensor_parallelism_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="quantization='int8' does not support tensor_parallel_size > 1"):
        ModelConfig(dtype="float32", model="builtin", quantization="int8", tensor_parallel_size=2)
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    args = parser.parse_args(["--model", "builtin", "--quantization", "gguf", "--tensor-parallel-size", "2"])
    with pytest.raises(ValueError, match="quantization='gguf'"):
        engine_config_from_args(args)


@pytest.mark.skipif(not quantized_kernels_work(), reason="torch lacks the CPU int8 kernels")
def test_lora_wraps_quantized_projections(tmp_path) -> None:
    """int8 linears are in place before LoRA wraps the projections: the adapters run on top of them,
    and the first greedy token mostly agrees with PEFT on the float model (as int8 does without LoRA)."""
    base = make_tiny_hf_model("llama", tmp_path / "base", seed=11)
    name = next(iter(ADAPTER_SPECS))
    adapters = make_adapters(base, tmp_path, [name])
    engine = LLMEngine(EngineConfig(
        model=ModelConfig(dtype="float32", model=str(base), quantization="int8"),
        cache=CacheConfig(num_kv_blocks=128),
        scheduler=SchedulerConfig(max_num_batched_tokens=256, max_num_seqs=8),
        lora=LoRAConfig(modules=((name, str(adapters[name])),), max_loras=2, max_lora_rank=64)))
    wrapped = engine.runner.model.model.layers[0].self_attn.qkv_proj
    assert any(isinstance(module, Int8Linear) for module in wrapped.modules()), wrapped
    assert type(wrapped) is not Int8Linear  # the LoRA wrapper, around the quantized linear
    rng = np.random.default_rng(7)
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    requests = {f"r{i}": (rng.integers(3, 512, 5 + i).tolist(), params, name) for i in range(12)}
    results = run_with_adapters(engine, requests)
    reference = peft_model(base, adapters[name])
    agree = 0
    for request_id, (prompt, _, _) in requests.items():
        theirs, _ = hf_greedy(reference, prompt, 4)
        ours = results[request_id]["tokens"]
        assert len(ours) == 4
        agree += ours[0] == theirs[0]
    assert agree / len(requests) >= 0.75, agree
