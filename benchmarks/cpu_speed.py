"""Single-stream decode speed on the CPU, side by side in one process: float32, bfloat16, GGUF's
Q4 blocks kept quantized (also with prompt lookup), int8 per channel, and llama.cpp on the same file
when installed (also with its prompt lookup).

    python benchmarks/cpu_speed.py --model smollm2 --output-len 128 --rounds 3 [--threads N]

Each round runs every configuration once, in turn (so load from other processes falls on all of
them alike): one request, a fixed prompt of `--prompt-len` tokens (default 16), `--output-len`
greedy tokens ignoring EOS, prefill included. Printed per configuration: the median tokens/s (wall
clock), the median process CPU seconds per token, the ratio to the bfloat16 memory floor = the
tokens/s at which reading the bfloat16 weights once per token takes all of the box's measured read
bandwidth, and the median seconds per request (with `--output-len 1`, about the prefill's time).
"""

from __future__ import annotations

from actors.kit.process_tuning import passive_omp_wait

passive_omp_wait()  # as the `aqueduct` CLI does, before anything loads torch and its OpenMP runtime

import argparse
import math
import statistics
import time
from collections.abc import Callable

import torch
from safetensors import safe_open

from actors.cli.bench import Workload, gguf_file_of, llama_cpp_available, time_llama_cpp
from pipeline.config import CacheConfig, EngineConfig, ModelConfig, SpeculativeConfig
from pipeline.engine import LLMEngine
from pipeline.loading.model_source import resolve_model
from pipeline.model.layers.quantized_linear import per_group_kernel_only
from pipeline.model.loader import weight_files
from pipeline.request.sampling_params import SamplingParams

CONFIGS = {  # name -> (dtype, quantization, cpu_linear, quantized layers on their kernels for every row count)
    "float32": ("float32", "none", "auto", False),
    "bfloat16": ("bfloat16", "none", "auto", False),
    "gguf-q4 (bf16)": ("bfloat16", "gguf", "auto", False),
    # Prompt lookup (k = 4; docs/speculative.md): what it gains on this workload, whose output copies
    # only what the model itself repeats.
    "gguf-q4 ngram": ("bfloat16", "gguf", "auto", False),
    # The prefill too on the per-group kernels: what the dequantized product for many rows gains
    # (quantized_linear.py).
    "gguf-q4 kernel": ("bfloat16", "gguf", "auto", True),
    "int8 (bf16)": ("bfloat16", "int8", "auto", False),
    # oneDNN's and torch's kernels only (no native decode kernels): what auto gains over them.
    "float32 onednn": ("float32", "none", "onednn", False),
    "bfloat16 onednn": ("bfloat16", "none", "onednn", False),
    "gguf-q4 onednn": ("bfloat16", "gguf", "onednn", False),
}


def read_bandwidth(megabytes: int = 512, repeats: int = 5) -> float:
    """Bytes/s of a multithreaded sum over a buffer far larger than the caches (best of `repeats`)."""
    buffer = torch.ones(megabytes * 2**20 // 4)
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        buffer.sum()
        best = min(best, time.perf_counter() - started)
    return buffer.numel() * 4 / best


LOOKUP_TOKENS = 4  # the ngram configuration's k, and llama.cpp's prompt lookup's


def engine_runner(model: str, dtype: str, quantization: str, cpu_linear: str, kernel_only: bool,
                  prompt: list[int], speculative: bool = False) -> Callable[[int], float | None]:
    engine = LLMEngine(EngineConfig(model=ModelConfig(model=model, dtype=dtype, quantization=quantization,
                                                      cpu_linear=cpu_linear),
                                    cache=CacheConfig(kv_cache_memory=64 * 2**20),
                                    speculative=SpeculativeConfig(num_speculative_tokens=LOOKUP_TOKENS)
                                    if speculative else None))
    counter = iter(range(10**9))

    def run(output_len: int) -> float | None:
        params = SamplingParams(max_tokens=output_len, temperature=0.0, ignore_eos=True)
        index = next(counter)  # a new first token each run: no prefix-cache hits on earlier runs' prompts
        engine.add_request(f"speed-{index}", [prompt[0] + index, *prompt[1:]], params)
        with per_group_kernel_only(kernel_only):
            while engine.has_unfinished:
                engine.step()

    return run


def llama_cpp_runner(model: str, prompt: list[int],
                     lookup_tokens: int | None = None) -> Callable[[int], float | None] | None:
    """llama.cpp on the model's GGUF file (with its prompt lookup of `lookup_tokens` tokens when given),
    timed in a child process (actors/cli/bench.py says why)."""
    path = gguf_file_of(model)
    if path is None or not llama_cpp_available():
        return None
    threads = torch.get_num_threads()

    def run(output_len: int) -> float | None:
        workload = Workload([prompt], [output_len])
        return time_llama_cpp(path, workload, threads, lookup_tokens)

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--prompt-len", type=int, default=16)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", nargs="*", default=None, help="configuration names to run (default: all)")
    parser.add_argument("--threads", type=int, default=None, help="compute threads for every configuration "
                        "(default: torch's); llama.cpp gets the same number")
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    prompt = list(range(100, 100 + args.prompt_len))
    runners = {name: engine_runner(args.model, *config, prompt, speculative=name.endswith("ngram"))
               for name, config in CONFIGS.items() if args.only is None or name in args.only}
    for name, lookup in (("llama.cpp", None), ("llama.cpp lookup", LOOKUP_TOKENS)):
        if args.only is None or name in args.only:
            peer = llama_cpp_runner(args.model, prompt, lookup)
            if peer is not None:
                runners[name] = peer
            else:
                print(f"{name}: skipped (llama-cpp-python not installed, or the model is not a GGUF file)")
    bf16_bytes = 2 * checkpoint_parameters(str(resolve_model(args.model, torch.bfloat16).path))
    for name, run in list(runners.items()):
        if not name.startswith("llama.cpp"):  # llama.cpp warms up in its own process, each time
            run(8)
    walls: dict[str, list[float]] = {name: [] for name in runners}
    cpus: dict[str, list[float]] = {name: [] for name in runners}
    bandwidths = []
    for _ in range(args.rounds):
        bandwidths.append(read_bandwidth())
        for name, run in runners.items():
            wall, cpu = time.perf_counter(), time.process_time()
            seconds = run(args.output_len)  # llama.cpp: its own timing, taken in its process
            if seconds is not None:
                walls[name].append(seconds)
            elif name.startswith("llama.cpp"):
                continue  # it crashed; reported below
            else:
                walls[name].append(time.perf_counter() - wall)
                cpus[name].append(time.process_time() - cpu)
    bandwidth = statistics.median(bandwidths)
    floor_rate = bandwidth / bf16_bytes
    print(f"{args.model}: {args.prompt_len}-token prompt, {args.output_len} greedy tokens, one request, "
          f"{torch.get_num_threads()} threads, "
          f"{args.rounds} rounds; read bandwidth {bandwidth / 1e9:.1f} GB/s; bfloat16 weights "
          f"{bf16_bytes / 1e6:.0f} MB -> floor {floor_rate:.1f} tokens/s")
    print(f"{'configuration':<16} {'tokens/s':>9} {'CPU ms/token':>13} {'x floor':>8} {'request s':>10}")
    for name in runners:
        if not walls[name]:
            print(f"{name:<16} crashed (a native fault in its process)")
            continue
        rate = args.output_len / statistics.median(walls[name])
        cpu_ms = f"{statistics.median(cpus[name]) / args.output_len * 1e3:.1f}" if cpus[name] else "-"
        print(f"{name:<16} {rate:>9.1f} {cpu_ms:>13} {rate / floor_rate:>8.2f} {statistics.median(walls[name]):>10.3f}")


def checkpoint_parameters(model_dir: str) -> int:
    """Weights in the model's (converted) checkpoint; a tied head is one tensor, read once a token."""
    total = 0
    for path in weight_files(model_dir):
        with safe_open(str(path), framework="pt") as f:
            total += sum(math.prod(f.get_slice(name).get_shape()) for name in f.keys())  # noqa: SIM118
    return total


if __name__ == "__main__":
    main()
