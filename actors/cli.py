"""The `aqueduct` command line: batch, bench."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import structlog

from actors.engine_args import add_engine_args, engine_config_from_args
from actors.logging_setup import configure_logging

log = structlog.get_logger(__name__)


def _batch(args: argparse.Namespace) -> int:
    from actors.batch import run_batch
    from pipeline.engine import LLMEngine

    engine = LLMEngine(engine_config_from_args(args))
    summary = run_batch(engine, Path(args.input), Path(args.output), progress=not args.no_progress)
    log.info("batch done", output=args.output, **summary)
    return 0


def _bench(args: argparse.Namespace) -> int:
    from actors.bench import run_bench

    run_bench(args)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="aqueduct", description="Aqueduct LLM inference service")
    parser.add_argument("--log-level", default="INFO")
    commands = parser.add_subparsers(dest="command", required=True)

    batch = commands.add_parser("batch", help="run an OpenAI batch file (/v1/completions) offline")
    batch.add_argument("-i", "--input", required=True, help="input .jsonl")
    batch.add_argument("-o", "--output", required=True, help="output .jsonl")
    batch.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_engine_args(batch)
    batch.set_defaults(handler=_batch)

    bench = commands.add_parser("bench", help="synthetic throughput: this engine vs HF transformers generate")
    bench.add_argument("--num-requests", type=int, default=128)
    bench.add_argument("--prompt-len", type=int, nargs=2, default=[16, 256], metavar=("MIN", "MAX"))
    bench.add_argument("--output-len", type=int, nargs=2, default=[16, 256], metavar=("MIN", "MAX"))
    bench.add_argument("--hf-batch-size", type=int, default=None, help="HF static batch size (default: all)")
    bench.add_argument("--skip-hf", action="store_true", help="measure this engine only")
    bench.add_argument("--workload-seed", type=int, default=0)
    add_engine_args(bench)
    bench.set_defaults(handler=_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure_logging(args.log_level)
    try:
        return args.handler(args)
    except (ValueError, FileNotFoundError) as error:
        log.error("failed", error=str(error))
        return 2


if __name__ == "__main__":
    sys.exit(main())
