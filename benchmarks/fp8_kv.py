"""fp8 KV cache against the float32 cache: token agreement, next-token KL, capacity, decode speed.

For each fp8 format, over a fixed set of prompts (tests/support/fp8_agreement.py): the share of greedy
output tokens identical to the float32 cache's, the mean (and max) KL(p_float32 || p_fp8) of the
teacher-forced next-token distributions, and the KV blocks that the same --kv-cache-memory holds
(the capacity ratio). Then the CPU decode-attention kernel side by side on one cache shape:
float32 cache, fp8 bytes decoded inside the kernel (what the engine does), and fp8 blocks
dequantized to float32 by torch before the float32 kernel (the alternative).

    python benchmarks/fp8_kv.py --model smollm2 --kv-cache-memory 256MiB
    python benchmarks/fp8_kv.py --model tiny-llama --calculate-kv-scales
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from pipeline.config import parse_size
from pipeline.model.attention.fp8_kv import FP8_DTYPES, KERNEL_FORMATS
from pipeline.model.cpu.kernels import load_decode_kernel
from tests.support.fp8_agreement import fixed_prompts, make_cache_engine, measure_agreement

# Natural-text prompts for a real model (a tiny random one gets fixed random token prompts).
_TEXT_PROMPTS = (
    "The capital of France is",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Water boils at a temperature of",
    "Here is a short story about a lighthouse keeper who finds a message in a bottle:",
    "List three reasons why the sky appears blue during the day.",
    "Translate to French: The weather is nice today and we are going to the beach.",
    "The mitochondria is the powerhouse of the cell. It produces",
    "Once upon a time, in a small village at the edge of a great forest, there lived",
)


def _model_path(name: str, tmp: Path) -> str:
    if name.startswith("tiny-"):
        from tests.support.hf_models import make_tiny_hf_model

        return str(make_tiny_hf_model(name.removeprefix("tiny-"), tmp / name))
    return name


def _prompts(engine, count: int) -> list[list[int]]:
    if engine.tokenizer is not None:
        return [engine.tokenizer.encode(text) for text in _TEXT_PROMPTS[:count]]
    return fixed_prompts(engine.vocab_size, count)


def agreement_rows(model: str, args: argparse.Namespace) -> None:
    memory = parse_size(args.kv_cache_memory)
    reference = make_cache_engine(model, "auto", num_kv_blocks=None, kv_cache_memory=memory)
    prompts = _prompts(reference, args.prompts)
    base_blocks = reference.runner.num_kv_blocks
    print(f"model {model}: {len(prompts)} prompts, {args.max_tokens} greedy tokens each; "
          f"--kv-cache-memory {args.kv_cache_memory}: float32 cache {base_blocks} blocks")
    print(f"{'kv cache':<10} {'scales':<11} {'identical':>10} {'mean KL':>10} {'max KL':>10} "
          f"{'blocks':>8} {'ratio':>6}")
    for kv_dtype in FP8_DTYPES:
        candidate = make_cache_engine(model, kv_dtype, num_kv_blocks=None, kv_cache_memory=memory,
                                      calculate_kv_scales=args.calculate_kv_scales)
        fresh_reference = make_cache_engine(model, "auto", num_kv_blocks=None, kv_cache_memory=memory)
        result = measure_agreement(fresh_reference, candidate, prompts, args.max_tokens)
        blocks = candidate.runner.num_kv_blocks
        scales = "calculated" if args.calculate_kv_scales else "checkpoint"
        print(f"{kv_dtype:<10} {scales:<11} {result.identical_share:>10.3f} {result.mean_kl:>10.2e} "
              f"{result.max_kl:>10.2e} {blocks:>8} {blocks / base_blocks:>6.2f}")


def _time(fn, repeats: int) -> float:
    fn()
    started = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - started) / repeats


def kernel_rows(args: argparse.Namespace) -> None:
    """Decode attention over --kernel-seqs sequences of --kernel-len tokens (SmolLM2's shape: 9 query
    heads, 3 KV heads, head_dim 64), blocks scattered through the cache."""
    kernel = load_decode_kernel()
    if kernel is None:
        print("no C compiler: CPU kernel comparison skipped")
        return
    heads, kv_heads, head_dim, block_size = 9, 3, 64, 16
    num_seqs, length = args.kernel_seqs, args.kernel_len
    per_seq = -(-length // block_size)
    num_blocks = num_seqs * per_seq + 8
    rng = np.random.default_rng(0)
    tables = torch.from_numpy(rng.permutation(num_blocks)[: num_seqs * per_seq].reshape(num_seqs, per_seq)
                              .astype(np.int32))
    seq_lens = torch.full((num_seqs,), length, dtype=torch.int32)
    q = torch.randn(num_seqs, heads, head_dim)
    cache32 = torch.randn(2, num_blocks, block_size, kv_heads, head_dim)
    scale = head_dim**-0.5
    base = _time(lambda: kernel(q, cache32, tables, seq_lens, length, scale), args.repeats)
    print(f"CPU decode kernel, {num_seqs} seqs x {length} tokens, {torch.get_num_threads()} threads "
          f"(noisy shared box; ratios to the float32 cache):")
    print(f"  float32 cache               {base * 1e3:8.3f} ms  1.00")
    for name, dtype in FP8_DTYPES.items():
        cache8 = cache32.to(dtype)
        fmt = KERNEL_FORMATS[dtype]
        native = _time(lambda: kernel(q, cache8, tables, seq_lens, length, scale, kv_format=fmt,  # noqa: B023
                                      k_scale=1.0, v_scale=1.0), args.repeats)
        flat_ids = tables.reshape(-1).long()
        dense_tables = torch.arange(num_seqs * per_seq, dtype=torch.int32).reshape(num_seqs, per_seq)

        def dequantize_then_kernel() -> torch.Tensor:
            gathered = cache8.view(torch.uint8).index_select(1, flat_ids).view(dtype).float()  # noqa: B023
            return kernel(q, gathered, dense_tables, seq_lens, length, scale)  # noqa: B023

        torch.testing.assert_close(dequantize_then_kernel(), kernel(q, cache8, tables, seq_lens, length, scale,
                                                                    kv_format=fmt), atol=1e-5, rtol=1e-5)
        dequant = _time(dequantize_then_kernel, args.repeats)
        print(f"  {name} decoded in kernel    {native * 1e3:8.3f} ms  {native / base:.2f}")
        print(f"  {name} dequantized first    {dequant * 1e3:8.3f} ms  {dequant / base:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2",
                        help="as the engine's --model, or tiny-<arch> for a tiny random HF model "
                             "(tests/support/hf_models.py)")
    parser.add_argument("--kv-cache-memory", default="256MiB")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--calculate-kv-scales", action="store_true")
    parser.add_argument("--kernel-seqs", type=int, default=32)
    parser.add_argument("--kernel-len", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--skip-agreement", action="store_true")
    parser.add_argument("--skip-kernel", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if not args.skip_agreement:
            agreement_rows(_model_path(args.model, Path(tmp)), args)
    if not args.skip_kernel:
        kernel_rows(args)


if __name__ == "__main__":
    main()
