"""Where a prefill step's time goes, against the box's measured arithmetic peak.

    python benchmarks/prefill_profile.py --model smollm2 [--dtype float32] [--quantization none]
        [--prompts 8] [--prompt-len 256] [--repeats 5]

First the peak: register-only loops of float32 FMAs and, where the CPU has AVX512-BF16, of bfloat16
dot products (`benchmarks/peak_flops.c`, built with the system's C compiler), one per compute thread,
all at once. AMX's tile products are not measured (a CPU with AMX multiplies bfloat16 faster than
this bfloat16 peak).

Then `--repeats` prefill steps, each `--prompts` new random prompts of `--prompt-len` tokens taken in
one step, after one step to warm up. Inside each step the model's linear layers (every module with
in/out features and none inside it), its attention backend's calls, the fused rope + K/V writes and
its RMSNorms are timed. Printed, medians over the repeats: each part's seconds and share of the
step, the rest (embedding, activations, Python, the sampler, scheduling) and the linear layers'
GFLOP/s as a share of the peak of the arithmetic they run in (bfloat16 for bfloat16 models, float32
for float32 ones). A step of few enough rows goes whole through the native decoder (float32 steps of
up to 256 rows, their prefill rows as one-query rows), where there are no parts to time: the
defaults' 2,048 tokens run layer by layer.
"""

from __future__ import annotations

from actors.kit.process_tuning import passive_omp_wait

passive_omp_wait()  # as the `aqueduct` CLI does, before anything loads torch and its OpenMP runtime

import argparse
import ctypes
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from pipeline.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from pipeline.engine import LLMEngine
from pipeline.model.layers.norms import RMSNorm
from pipeline.request.sampling_params import SamplingParams

PEAK_SOURCE = Path(__file__).with_name("peak_flops.c")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--quantization", default="auto")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    threads = torch.get_num_threads()
    peaks = measure_peaks(threads)
    for name, gflops in peaks.items():
        print(f"peak, {name}: {gflops:.1f} GFLOP/s on {threads} threads" if gflops else
              f"peak, {name}: not measured (no such instructions on this CPU or no compiler)")
    tokens = args.prompts * args.prompt_len
    engine = LLMEngine(EngineConfig(
        model=ModelConfig(model=args.model, dtype=args.dtype, quantization=args.quantization),
        cache=CacheConfig(enable_prefix_caching=False),
        scheduler=SchedulerConfig(max_num_batched_tokens=tokens, max_num_seqs=max(args.prompts, 1))))
    steps = [profile_step(engine, args.prompts, args.prompt_len, seed) for seed in range(args.repeats + 1)][1:]
    report(steps, tokens, peaks, engine)


def measure_peaks(threads: int) -> dict[str, float | None]:
    """GFLOP/s of each register-only loop, `threads` copies at once; None where it cannot run."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return {"float32 FMA": None, "bfloat16 dot products": None}
    with tempfile.TemporaryDirectory() as folder:
        library_path = Path(folder) / "peak_flops.so"
        built = subprocess.run([compiler, "-O3", "-march=native", "-shared", "-fPIC", str(PEAK_SOURCE), "-o",
                                str(library_path)], capture_output=True)
        if built.returncode != 0:  # -march=native unknown to this compiler, say
            return {"float32 FMA": None, "bfloat16 dot products": None}
        library = ctypes.CDLL(str(library_path))
        return {"float32 FMA": loop_gflops(library.float32_fma_loop, threads),
                "bfloat16 dot products": loop_gflops(library.bfloat16_dot_loop, threads)}


def loop_gflops(loop: Callable[..., int], threads: int, iterations: int = 20_000_000) -> float | None:
    """The best of three runs of `loop` on `threads` Python threads at once (ctypes lets go of the GIL)."""
    loop.argtypes, loop.restype = [ctypes.c_longlong, ctypes.POINTER(ctypes.c_float)], ctypes.c_longlong
    sink = ctypes.c_float()
    if loop(1, ctypes.byref(sink)) < 0:
        return None
    best = 0.0
    for _ in range(3):
        done: list[int] = []
        workers = [threading.Thread(target=_run_loop, args=(loop, iterations, done)) for _ in range(threads)]
        started = time.perf_counter()
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        best = max(best, sum(done) / (time.perf_counter() - started) / 1e9)
    return best


def _run_loop(loop: Callable[..., int], iterations: int, done: list[int]) -> None:
    done.append(loop(iterations, ctypes.byref(ctypes.c_float())))


class PartTimer:
    """Seconds and linear-layer FLOPs per part, added up by hooks around the model's modules and calls."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.linear_flops = 0.0

    @contextmanager
    def timing(self, part: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[part] += time.perf_counter() - started

    def wrap(self, part: str, function: Callable[..., object]) -> Callable[..., object]:
        def timed(*args: object, **kwargs: object) -> object:
            with self.timing(part):
                return function(*args, **kwargs)
        return timed


@contextmanager
def parts_timed(model: torch.nn.Module, timer: PartTimer) -> Iterator[None]:
    """Linear layers and RMSNorms timed by forward hooks; the attention backend's forward and fused rope +
    K/V write by wrapping them on the backend object; all undone on exit."""
    handles = []
    heads = []  # heads whose float32 logits (compute_logits) bypass forward(), and so its hooks
    for module in model.modules():
        part = "linear layers" if _is_linear(module) else "RMSNorm" if isinstance(module, RMSNorm) else None
        if part is not None:
            handles += _hook_module(module, part, timer)
        if part == "linear layers" and callable(getattr(module, "forward_float32", None)) \
                and "forward_float32" not in vars(module):
            module.forward_float32 = _timed_float32_head(module, module.forward_float32, timer)
            heads.append(module)
    backends = {id(module.backend): module.backend for module in model.modules() if hasattr(module, "backend")}
    wrapped = [(backend, name, getattr(backend, name)) for backend in backends.values()
               for name in ("forward", "rope_and_write_kv")
               if callable(getattr(backend, name, None)) and name not in vars(backend)]
    for backend, name, function in wrapped:
        setattr(backend, name, timer.wrap("attention" if name == "forward" else "rope + K/V writes", function))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
        for module in heads:
            del module.forward_float32  # the class's method again
        for backend, name, _ in wrapped:
            delattr(backend, name)  # the class's method again


def _is_linear(module: torch.nn.Module) -> bool:
    return (hasattr(module, "in_features") and hasattr(module, "out_features")
            and not any(hasattr(child, "in_features") for child in module.children()))


def _hook_module(module: torch.nn.Module, part: str, timer: PartTimer) -> list:
    started: list[float] = []

    def before(_module: torch.nn.Module, inputs: tuple) -> None:
        started.append(time.perf_counter())

    def after(_module: torch.nn.Module, inputs: tuple, _output: object) -> None:
        timer.seconds[part] += time.perf_counter() - started.pop()
        if part == "linear layers":
            timer.linear_flops += _linear_flops(module, inputs[0])

    return [module.register_forward_pre_hook(before), module.register_forward_hook(after)]


def _timed_float32_head(module: torch.nn.Module, function: Callable[[torch.Tensor], torch.Tensor | None],
                        timer: PartTimer) -> Callable[[torch.Tensor], torch.Tensor | None]:
    """`module.forward_float32` timed; its FLOPs counted when it answers (None: forward() runs, hooked)."""
    def timed(x: torch.Tensor) -> torch.Tensor | None:
        with timer.timing("linear layers"):
            logits = function(x)
        if logits is not None:
            timer.linear_flops += _linear_flops(module, x)
        return logits
    return timed


def _linear_flops(module: torch.nn.Module, x: torch.Tensor) -> float:
    rows = x.numel() // module.in_features
    return 2.0 * rows * module.in_features * module.out_features


def profile_step(engine: LLMEngine, prompts: int, prompt_len: int, seed: int) -> tuple[float, PartTimer]:
    """One step that takes `prompts` new random prompts whole: (its seconds, the parts' timer)."""
    generator = torch.Generator().manual_seed(seed)
    vocab = getattr(getattr(engine.runner.model, "config", None), "vocab_size", 32000)
    for index in range(prompts):
        token_ids = torch.randint(10, vocab, (prompt_len,), generator=generator).tolist()
        engine.add_request(f"prefill-{seed}-{index}", token_ids,
                           SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True))
    timer = PartTimer()
    with parts_timed(engine.runner.model, timer):
        started = time.perf_counter()
        engine.step()
        seconds = time.perf_counter() - started
    while engine.has_unfinished:  # a step that did not take every prompt is not a clean sample
        engine.step()
    return seconds, timer


def report(steps: list[tuple[float, PartTimer]], tokens: int, peaks: dict[str, float | None],
           engine: LLMEngine) -> None:
    step = statistics.median(seconds for seconds, _ in steps)
    print(f"prefill step of {tokens} tokens: {step:.3f} s (median of {len(steps)}; "
          f"{min(s for s, _ in steps):.3f}-{max(s for s, _ in steps):.3f}), dtype {engine.runner.dtype}")
    parts = sorted({part for _, timer in steps for part in timer.seconds})
    timed = 0.0
    for part in parts:
        seconds = statistics.median(timer.seconds.get(part, 0.0) for _, timer in steps)
        timed += seconds
        print(f"  {part:<20} {seconds:8.3f} s  {seconds / step:6.1%}")
    print(f"  {'rest':<20} {step - timed:8.3f} s  {(step - timed) / step:6.1%}")
    if "linear layers" not in parts:
        print("no linear layer ran through the model's modules: the native decoder took the whole step "
              "(more tokens, --prompts x --prompt-len, run layer by layer)")
        return
    linear = statistics.median(timer.seconds["linear layers"] for _, timer in steps)
    gflops = statistics.median(timer.linear_flops for _, timer in steps) / linear / 1e9
    # The products' own arithmetic: bfloat16 models multiply bfloat16 (oneDNN, or the kernels' copies of
    # quantized weights), float32 ones float32.
    name = "bfloat16 dot products" if engine.runner.dtype == torch.bfloat16 else "float32 FMA"
    share = f" ({gflops / peaks[name]:.0%} of the {name} peak)" if peaks.get(name) else ""
    print(f"linear layers: {gflops:.1f} GFLOP/s{share}")


if __name__ == "__main__":
    main()
