"""Where one decode step of a single sequence goes: wall time per step, then torch.profiler's table.

    python benchmarks/decode_profile.py --model smollm2 [--dtype bfloat16] [--quantization gguf]

Runs one greedy request through the engine's step loop (prompt 16 tokens), times `--steps`
decode steps after a warm-up, and prints the ops that took the most self time over
`--profile-steps` further steps (the whole step: scheduler, tensor prep, forward, sampler).
"""

from __future__ import annotations

from actors.process_tuning import passive_omp_wait

passive_omp_wait()  # as the `aqueduct` CLI does, before anything loads torch and its OpenMP runtime

import argparse
import time

import torch
from torch.profiler import ProfilerActivity, profile

from pipeline.config import EngineConfig, ModelConfig
from pipeline.engine import LLMEngine
from pipeline.sampling_params import SamplingParams


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--quantization", default="none")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--profile-steps", type=int, default=10)
    parser.add_argument("--rows", type=int, default=25, help="rows of the profiler table")
    args = parser.parse_args()
    engine = LLMEngine(EngineConfig(model=ModelConfig(model=args.model, dtype=args.dtype,
                                                      quantization=args.quantization)))
    total = 8 + args.steps + args.profile_steps + 4
    engine.add_request("profile", list(range(1, 17)), SamplingParams(max_tokens=total, temperature=0.0,
                                                                      ignore_eos=True))
    for _ in range(8):  # prefill and warm-up decodes
        engine.step()
    started = time.perf_counter()
    for _ in range(args.steps):
        engine.step()
    per_step = (time.perf_counter() - started) / args.steps
    print(f"decode step: {per_step * 1e3:.2f} ms ({1 / per_step:.1f} tokens/s), "
          f"{torch.get_num_threads()} threads, dtype {engine.runner.dtype}, quantization {args.quantization}")
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(args.profile_steps):
            engine.step()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.rows))


if __name__ == "__main__":
    main()
