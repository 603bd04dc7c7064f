"""`aqueduct bench`: one synthetic workload through this engine and through HF transformers.

The workload is N requests with prompt and output lengths uniform in the given ranges, random
token-id prompts, greedy, ignore_eos (every request generates exactly its output length). The
baseline is HF `generate` with static batching and left padding on the same weights: a batch
runs until its longest request is done, so only each request's own output length counts as
useful tokens on both sides. Model loading is outside both timings.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

import numpy as np
import structlog

from actors.frontends.engine_args import engine_config_from_args
from pipeline.engine import EngineStats, LLMEngine
from pipeline.sampling_params import SamplingParams

log = structlog.get_logger(__name__)


@dataclass(slots=True)
class Workload:
    prompts: list[list[int]]
    output_lens: list[int]

    @property
    def useful_tokens(self) -> int:
        return sum(self.output_lens)


def make_workload(num_requests: int, prompt_len: tuple[int, int], output_len: tuple[int, int],
                  vocab_size: int, seed: int) -> Workload:
    rng = np.random.default_rng(seed)
    prompt_lens = rng.integers(prompt_len[0], prompt_len[1] + 1, num_requests)
    # Token 0 is avoided: the HF baseline pads with it.
    prompts = [rng.integers(1, vocab_size, n).tolist() for n in prompt_lens]
    output_lens = rng.integers(output_len[0], output_len[1] + 1, num_requests).tolist()
    return Workload(prompts, output_lens)


def run_engine(engine: LLMEngine, workload: Workload) -> tuple[float, float, float]:
    """Seconds of wall time, and the shares of it spent in the model forward and in sampling."""
    engine.stats = EngineStats()
    started = time.perf_counter()
    for index, (prompt, output_len) in enumerate(zip(workload.prompts, workload.output_lens, strict=True)):
        params = SamplingParams(max_tokens=output_len, temperature=0.0, ignore_eos=True)
        engine.add_request(f"bench-{index}", prompt, params)
    while engine.has_unfinished:
        engine.step()
    elapsed = time.perf_counter() - started
    return elapsed, engine.stats.forward_seconds / elapsed, engine.stats.sample_seconds / elapsed


def run_hf(model_dir: str, workload: Workload, batch_size: int) -> float:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None  # ignore_eos: generate the full length
    model.generation_config.pad_token_id = 0
    started = time.perf_counter()
    for start in range(0, len(workload.prompts), batch_size):
        prompts = workload.prompts[start:start + batch_size]
        max_new = max(workload.output_lens[start:start + batch_size])
        width = max(len(p) for p in prompts)
        input_ids = torch.zeros((len(prompts), width), dtype=torch.long)
        attention_mask = torch.zeros_like(input_ids)
        for row, prompt in enumerate(prompts):  # left padding
            input_ids[row, width - len(prompt):] = torch.tensor(prompt)
            attention_mask[row, width - len(prompt):] = 1
        with torch.inference_mode():
            model.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=max_new,
                           do_sample=False)
    return time.perf_counter() - started


def run_bench(args: argparse.Namespace) -> None:
    engine = LLMEngine(engine_config_from_args(args))
    workload = make_workload(args.num_requests, tuple(args.prompt_len), tuple(args.output_len),
                             engine.vocab_size, args.workload_seed)
    # Warm-up (allocator, kernels) on a tiny workload, outside the timing.
    run_engine(engine, make_workload(4, (8, 16), (4, 8), engine.vocab_size, seed=1))
    ours_seconds, forward_share, sample_share = run_engine(engine, workload)
    ours_rate = workload.useful_tokens / ours_seconds
    print(f"workload: {args.num_requests} requests, prompt {args.prompt_len[0]}-{args.prompt_len[1]}, "
          f"output {args.output_len[0]}-{args.output_len[1]} tokens, {workload.useful_tokens} useful tokens")
    print(f"aqueduct: {ours_seconds:.2f} s, {ours_rate:.1f} useful tokens/s, "
          f"model forward {forward_share:.0%} of wall time, sampling {sample_share:.0%}, "
          f"{engine.stats.num_steps} steps, preemptions {engine.scheduler.num_preemptions}")
    if args.skip_hf:
        return
    batch_size = args.hf_batch_size or args.num_requests
    hf_seconds = run_hf(str(engine.model_dir), workload, batch_size)
    hf_rate = workload.useful_tokens / hf_seconds
    print(f"hf-generate (static batch {batch_size}): {hf_seconds:.2f} s, {hf_rate:.1f} useful tokens/s")
    print(f"ratio aqueduct / hf: {ours_rate / hf_rate:.2f}x")
