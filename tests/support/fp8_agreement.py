"""How close an fp8 KV cache keeps a model to its float32-cache self (tests/pipeline/model/attention/test_fp8_kv.py and
benchmarks/fp8_kv.py).

Two figures over a fixed set of prompts:
- token agreement: greedy generation through the whole engine with each cache; the share of output
  positions where both produced the same token (after a divergence the texts differ, so this is
  roughly how far the outputs stay together);
- mean KL(p_float32 || p_fp8) of the next-token distribution, teacher-forced: both runners prefill
  the prompt, then decode the float32 run's greedy continuation one token at a time (so every
  distribution after the first is computed from K/V read back from the cache), and the full
  distributions of each decode position are compared.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from pipeline.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from pipeline.engine import LLMEngine
from pipeline.model.runner import ModelRunner
from pipeline.request.sampling_params import SamplingParams
from pipeline.step.inputs import StepInputs
from tests.support.engine_helpers import run_requests


@dataclass(frozen=True, slots=True)
class Agreement:
    identical_tokens: int
    total_tokens: int
    mean_kl: float
    max_kl: float

    @property
    def identical_share(self) -> float:
        return self.identical_tokens / max(1, self.total_tokens)


def make_cache_engine(model: str | Path, kv_cache_dtype: str, *, num_kv_blocks: int | None = 256,
                      kv_cache_memory: int = 2**30, calculate_kv_scales: bool = False,
                      max_num_batched_tokens: int = 512) -> LLMEngine:
    return LLMEngine(EngineConfig(
        model=ModelConfig(quantization="none", dtype="float32", model=str(model)),
        cache=CacheConfig(num_kv_blocks=num_kv_blocks, kv_cache_memory=kv_cache_memory,
                          kv_cache_dtype=kv_cache_dtype, calculate_kv_scales=calculate_kv_scales),
        scheduler=SchedulerConfig(max_num_batched_tokens=max_num_batched_tokens)))


def greedy_outputs(engine: LLMEngine, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    results = run_requests(engine, {f"p{index}": (prompt, params) for index, prompt in enumerate(prompts)})
    return [results[f"p{index}"]["choices"][0]["token_ids"] for index in range(len(prompts))]


def _one_sequence_step(tokens: list[int], start: int, block_size: int) -> StepInputs:
    """Inputs that run `tokens` at positions start.. of one sequence whose block table is 0, 1, 2, ...
    (so slot = position); logits of the last token."""
    positions = np.arange(start, start + len(tokens), dtype=np.int64)
    end = start + len(tokens)
    return StepInputs(
        input_ids=np.asarray(tokens, dtype=np.int64), positions=positions, slot_mapping=positions.copy(),
        query_start_loc=np.array([0, len(tokens)], dtype=np.int32), seq_lens=np.array([end], dtype=np.int32),
        block_tables=np.arange(-(-end // block_size), dtype=np.int32)[None, :],
        logits_indices=np.array([len(tokens) - 1], dtype=np.int64), num_tokens=len(tokens),
        max_query_len=len(tokens), max_seq_len=end)


def teacher_forced_logprobs(runner: ModelRunner, prompt: list[int], continuation: list[int]) -> torch.Tensor:
    """Log-probabilities [len(continuation), vocab] of each next token: after the prompt, then after
    each continuation token fed as a decode step. Overwrites the cache's first blocks: run it after
    the engine's own requests, and none after it."""
    rows = [runner.execute(_one_sequence_step(prompt, 0, runner.block_size))]
    for offset, token in enumerate(continuation[:-1]):
        rows.append(runner.execute(_one_sequence_step([token], len(prompt) + offset, runner.block_size)))
    return torch.log_softmax(torch.cat(rows).double(), dim=-1)


def measure_agreement(reference: LLMEngine, candidate: LLMEngine, prompts: list[list[int]],
                      max_tokens: int) -> Agreement:
    """Token agreement and next-token KL of `candidate` against `reference` (DESIGN: same model)."""
    expected = greedy_outputs(reference, prompts, max_tokens)
    actual = greedy_outputs(candidate, prompts, max_tokens)
    identical = sum(a == b for ours, theirs in zip(actual, expected, strict=True)
                    for a, b in zip(ours, theirs, strict=True))
    kls = []
    for prompt, continuation in zip(prompts, expected, strict=True):
        p_log = teacher_forced_logprobs(reference.runner, prompt, continuation)
        q_log = teacher_forced_logprobs(candidate.runner, prompt, continuation)
        kls.append((p_log.exp() * (p_log - q_log)).sum(-1))
    kl = torch.cat(kls)
    return Agreement(identical, sum(map(len, expected)), float(kl.mean()), float(kl.max()))


def fixed_prompts(vocab_size: int, count: int = 8, seed: int = 0) -> list[list[int]]:
    """`count` token prompts of 12 to 96 tokens, the same for a given seed (ids 3.. avoid special tokens)."""
    rng = np.random.default_rng(seed)
    lengths = np.linspace(12, 96, count).astype(int)
    return [rng.integers(3, vocab_size, size=int(length)).tolist() for length in lengths]
