"""Where a decode step goes: wall time per step, the matmuls' share, then torch.profiler's table.

    python benchmarks/decode_profile.py --model smollm2 [--dtype bfloat16] [--quantization gguf] [--batch 32]
        [--without-kernels]

Runs `--batch` greedy requests (prompt 16 tokens each) through the engine's step loop, times
`--steps` decode steps after a warm-up, then times the model's linear layers alone, each on
`--batch` rows as in a step, and prints step time / matmul time; with `--without-kernels`, the
step again with the native kernels' C calls stubbed out (what the rest costs). Last, the ops that took the most
self time over `--profile-steps` further steps (the whole step: scheduler, tensor prep, forward,
sampler).
"""

from __future__ import annotations

from actors.kit.process_tuning import passive_omp_wait

passive_omp_wait()  # as the `aqueduct` CLI does, before anything loads torch and its OpenMP runtime

import argparse
import contextlib
import time
from collections.abc import Iterator

import torch
from torch.profiler import ProfilerActivity, profile

from pipeline.config import EngineConfig, ModelConfig
from pipeline.engine import LLMEngine
from pipeline.model.cpu import kernels as native_kernels
from pipeline.request.sampling_params import SamplingParams


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--quantization", default="none")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--profile-steps", type=int, default=10)
    parser.add_argument("--rows", type=int, default=25, help="rows of the profiler table")
    parser.add_argument("--batch", type=int, default=1, help="sequences decoding together")
    parser.add_argument("--without-kernels", action="store_true",
                        help="also time steps whose native kernel calls return at once (their outputs are then "
                             "garbage): what the step costs besides the kernels")
    args = parser.parse_args()
    engine = LLMEngine(EngineConfig(model=ModelConfig(model=args.model, dtype=args.dtype,
                                                      quantization=args.quantization)))
    total = 8 + args.steps + args.profile_steps + 4
    for index in range(args.batch):
        engine.add_request(f"profile-{index}", [1 + index, *range(2, 17)],
                           SamplingParams(max_tokens=total, temperature=0.0, ignore_eos=True))
    for _ in range(8):  # prefill and warm-up decodes
        engine.step()
    per_step = step_seconds(engine, args.steps)
    print(f"decode step, batch {args.batch}: {per_step * 1e3:.2f} ms ({args.batch / per_step:.1f} tokens/s), "
          f"{torch.get_num_threads()} threads, dtype {engine.runner.dtype}, quantization {args.quantization}")
    matmuls = matmul_seconds(engine.runner.model, args.batch, engine.runner.dtype)
    print(f"the step's linear layers alone ({args.batch} rows each): {matmuls * 1e3:.2f} ms; "
          f"step / matmuls = {per_step / matmuls:.2f}")
    if args.without_kernels:
        with native_kernels_stubbed(engine.runner.model):
            rest = step_seconds(engine, args.steps)
        print(f"the step without the native kernels' C calls (Python, torch ops, scheduling, sampling): "
              f"{rest * 1e3:.2f} ms ({rest / per_step:.0%} of the step)")
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(args.profile_steps):
            engine.step()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.rows))


def step_seconds(engine: LLMEngine, steps: int) -> float:
    started = time.perf_counter()
    for _ in range(steps):
        engine.step()
    return (time.perf_counter() - started) / steps


@contextlib.contextmanager
def native_kernels_stubbed(model: torch.nn.Module) -> Iterator[None]:
    """The loaded native kernels' C functions (and the model's native decoder layers' one) replaced
    by no-ops returning 0, then restored."""
    kernels = [load() for load in (native_kernels.load_decode_kernel, native_kernels.load_few_rows_linear_kernel,
                                   native_kernels.load_quantized_linear_kernel, native_kernels.load_rms_norm_kernel,
                                   native_kernels.load_rope_kv_kernel)]
    kernels.append(getattr(getattr(model, "language_model", model), "native_decoder", None))
    saved = [(kernel, name, getattr(kernel, name)) for kernel in kernels if kernel is not None
             for name in ("_fn", "_int4", "_int8", "_function") if hasattr(kernel, name)]
    for kernel, name, _ in saved:
        setattr(kernel, name, lambda *_args: 0)
    try:
        yield
    finally:
        for kernel, name, function in saved:
            setattr(kernel, name, function)


def matmul_seconds(model: torch.nn.Module, rows: int, dtype: torch.dtype, repeats: int = 20) -> float:
    """Seconds for one pass over every linear layer of `model` (the modules with in/out features and no
    such module inside: packed, quantized or plain), each on `rows` random rows; median of `repeats`."""
    layers = [m for m in model.modules() if hasattr(m, "in_features") and hasattr(m, "out_features")
              and not any(hasattr(c, "in_features") for c in m.children())]
    inputs = [torch.randn(rows, layer.in_features).to(dtype) for layer in layers]
    times = []
    with torch.inference_mode():
        for _ in range(repeats + 2):
            started = time.perf_counter()
            for layer, x in zip(layers, inputs, strict=True):
                layer(x)
            times.append(time.perf_counter() - started)
    return sorted(times[2:])[repeats // 2]


if __name__ == "__main__":
    main()
