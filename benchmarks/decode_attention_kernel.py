"""The native paged decode attention kernel alone (csrc/paged_decode_attention.c): microseconds a call
and the K/V read rate, for one sequence at several context lengths and for a batch.

    python benchmarks/decode_attention_kernel.py [--lengths 300 600 1000 4000] [--batch 32 300]
        [--heads 9 3 64] [--dtype float32] [--layers 30] [--rounds 7]

Each case holds `--layers` distinct caches (a decode step calls the kernel once per layer, each on
its own K/V), so the calls read from memory as in a step; the kernel's blocks are scattered through
each cache. The figure is the best round's mean over the layers' calls. To compare two builds, run
this from each checkout in turn (the native library is built and cached per source hash):

    git worktree add /tmp/before <commit> && (cd /tmp/before && python benchmarks/decode_attention_kernel.py)
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from actors.kit.process_tuning import passive_omp_wait

passive_omp_wait()

import torch

from pipeline.model.cpu.kernels import load_decode_kernel

BLOCK_SIZE = 16


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[300, 600, 1000, 4000],
                        help="context lengths of the one-sequence cases")
    parser.add_argument("--batch", type=int, nargs=2, default=[32, 300], metavar=("SEQUENCES", "LENGTH"))
    parser.add_argument("--heads", type=int, nargs=3, default=[9, 3, 64], metavar=("HEADS", "KV_HEADS", "HEAD_DIM"),
                        help="default: SmolLM2-135M's")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="the cache's")
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args()
    kernel = load_decode_kernel()
    if kernel is None:
        sys.exit("the native kernels are not built here (no C compiler?)")
    cases = [(1, length) for length in args.lengths] + [tuple(args.batch)]
    print(f"heads {args.heads}, {args.dtype} cache, {args.layers} layers' caches a case, best of {args.rounds} rounds")
    print("| sequences x tokens | threads | us a call | K/V GB/s |")
    print("|---|---|---|---|")
    for num_seqs, length in cases:
        for threads in args.threads:
            seconds, nbytes = time_case(kernel, num_seqs, length, args, threads)
            print(f"| {num_seqs} x {length} | {threads} | {seconds * 1e6:.1f} | {nbytes / seconds / 1e9:.1f} |")


def time_case(kernel, num_seqs: int, length: int, args: argparse.Namespace, threads: int) -> tuple[float, int]:
    """(best round's seconds a call, K/V bytes a call)."""
    num_heads, num_kv_heads, head_dim = args.heads
    dtype = getattr(torch, args.dtype)
    generator = torch.Generator().manual_seed(0)
    blocks_per_seq = -(-length // BLOCK_SIZE)
    num_blocks = num_seqs * blocks_per_seq
    caches = [torch.randn(2, num_blocks, BLOCK_SIZE, num_kv_heads, head_dim, generator=generator).to(dtype)
              for _ in range(args.layers)]
    tables = [torch.randperm(num_blocks, generator=generator).to(torch.int32).view(num_seqs, blocks_per_seq)
              for _ in range(args.layers)]
    lens = torch.full((num_seqs,), length, dtype=torch.int32)
    q = torch.randn(num_seqs, num_heads, head_dim, generator=generator).to(dtype)
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        best = float("inf")
        for _ in range(args.rounds + 1):  # the first round warms up
            started = time.perf_counter()
            for cache, table in zip(caches, tables, strict=True):
                kernel(q, cache, table, lens, length, head_dim**-0.5)
            best = min(best, (time.perf_counter() - started) / args.layers)
    finally:
        torch.set_num_threads(saved)
    return best, num_seqs * length * num_kv_heads * head_dim * 2 * caches[0].element_size()


if __name__ == "__main__":
    main()
