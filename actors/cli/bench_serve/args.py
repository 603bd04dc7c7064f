"""`aqueduct bench`'s flags for `--serve`, and the workload defaults of each mode.

With `--serve` the workload defaults to the one of issue 37's comparison: 32 requests, prompts of
40-400 words, 128 greedy tokens each, all 32 at once; without it, to `aqueduct bench`'s own (128
requests, outputs of 16-256 tokens).
"""

from __future__ import annotations

import argparse

ENGINE_DEFAULTS = {"num_requests": 128, "output_len": [16, 256]}
SERVE_DEFAULTS = {"num_requests": 32, "output_len": [128, 128]}


def add_bench_serve_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("--serve: over HTTP, against the peers' own servers")
    group.add_argument("--serve", action="store_true",
                       help="run the workload through `aqueduct serve` (embedded) and, where installed, "
                            "llama-server and vLLM's OpenAI server on the same model, one after another")
    group.add_argument("--prompt-words", type=int, nargs=2, default=[40, 400], metavar=("MIN", "MAX"),
                       help="--serve: prompt lengths in words (text prompts; default 40 400)")
    group.add_argument("--concurrency", type=int, default=32, help="--serve: requests in flight at once")
    group.add_argument("--one-stream-requests", type=int, default=3,
                       help="--serve: the workload's first N requests, one at a time, for decode tokens/s")
    group.add_argument("--llama-server", default=None, metavar="PATH",
                       help="--serve: llama.cpp's llama-server binary (default: llama-server on PATH)")
    group.add_argument("--vllm-python", default=None, metavar="PATH",
                       help="--serve: the python of an environment with vLLM installed (default: no vLLM)")
    group.add_argument("--server-timeout", type=float, default=900.0,
                       help="--serve: seconds a server may take to become healthy")


def resolve_bench_defaults(args: argparse.Namespace) -> argparse.Namespace:
    """Fill the workload flags left unset with the defaults of the mode `args.serve` picks."""
    defaults = SERVE_DEFAULTS if args.serve else ENGINE_DEFAULTS
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    return args
