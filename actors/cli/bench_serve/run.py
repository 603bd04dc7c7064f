"""`aqueduct bench --serve`: the same requests through `aqueduct serve` and the peers' own OpenAI
servers, one server at a time, and their figures side by side as ratios to aqueduct's.

Each server is started, waited for (/health), warmed up with one short request, measured (one
stream, then every request at once) and stopped before the next starts, so none competes with
another for the CPU; a peer that is not installed, or fails, gets a line saying so.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

import structlog

from actors.cli.bench_serve.client import served_model
from actors.cli.bench_serve.phases import ServerFigures, run_phases
from actors.cli.bench_serve.process import ServerFailed, free_port, log_tail, running_server
from actors.cli.bench_serve.servers import ServerSpec, Skipped, aqueduct_server, llama_server, vllm_server
from actors.cli.bench_serve.workload import ServeRequest, serve_workload
from pipeline.loading.model_source import default_cli_model

log = structlog.get_logger(__name__)

# Ratios are aqueduct's figure over the server's, as `aqueduct bench` prints them ("aqueduct / llama.cpp").
COLUMNS = ("server", "one stream decode tok/s", "concurrent output tok/s", "TTFT p50 s", "TTFT p99 s",
           "aqueduct / it: decode", "aqueduct / it: output", "aqueduct / it: TTFT p50")


def run_bench_serve(args: argparse.Namespace) -> int:
    model = args.model or default_cli_model()
    requests = serve_workload(args.num_requests, tuple(args.prompt_words), tuple(args.output_len),
                              args.workload_seed)
    _print_workload(args, requests)
    results: dict[str, ServerFigures] = {}
    with tempfile.TemporaryDirectory(prefix="aqueduct-bench-serve-") as logs:
        for make in (aqueduct_server, llama_server, vllm_server):
            port = free_port()
            spec = make(args, model, port)
            if isinstance(spec, Skipped):
                print(f"{spec.name}: skipped ({spec.reason})")
                continue
            figures = _measure(spec, port, requests, args, Path(logs))
            if figures is None and spec.name == "aqueduct":
                return 1  # no figure for the ratios: the peers would run for nothing
            if figures is not None:
                results[spec.name] = figures
    _print_table(results)
    return 0


def _measure(spec: ServerSpec, port: int, requests: list[ServeRequest], args: argparse.Namespace,
             logs: Path) -> ServerFigures | None:
    print(f"{spec.name}: {spec.weights}")
    log_path = logs / f"{spec.name}.log"
    try:
        with running_server(spec, port, log_path, args.server_timeout):
            figures = run_phases(port, served_model(port), requests, args.one_stream_requests, args.concurrency)
        print(f"{spec.name}: measured, {figures.concurrent_tokens} tokens in {figures.concurrent_seconds:.1f} s "
              f"concurrent; load average then {_load_average()}")
        return figures
    except ServerFailed as error:
        print(f"{spec.name}: failed, no figures: {error}")
    except (RuntimeError, OSError) as error:
        print(f"{spec.name}: failed, no figures: {error}; the end of its log:\n{log_tail(log_path)}")
    return None


def _print_workload(args: argparse.Namespace, requests: list[ServeRequest]) -> None:
    words = sum(len(request.prompt.split()) for request in requests)
    tokens = sum(request.max_tokens for request in requests)
    print(f"workload: {len(requests)} requests, prompts {args.prompt_words[0]}-{args.prompt_words[1]} words "
          f"({words} in all), {tokens} output tokens (greedy, ignore_eos), seed {args.workload_seed}; "
          f"one stream: the first {min(args.one_stream_requests, len(requests))} one at a time; "
          f"concurrent: {min(args.concurrency, len(requests))} at once; load average {_load_average()}")


def _load_average() -> str:
    """The 1, 5 and 15 minute load averages: on a shared box, what else ran beside the measurement."""
    return ", ".join(f"{value:.2f}" for value in os.getloadavg())


def _print_table(results: dict[str, ServerFigures]) -> None:
    ours = results["aqueduct"]
    print("| " + " | ".join(COLUMNS) + " |")
    print("|" + "---|" * len(COLUMNS))
    for name, figures in results.items():
        cells = (name, f"{figures.one_stream_decode_tps:.1f}", f"{figures.concurrent_output_tps:.1f}",
                 f"{figures.ttft_p50_s:.2f}", f"{figures.ttft_p99_s:.2f}",
                 f"{ours.one_stream_decode_tps / figures.one_stream_decode_tps:.2f}x",
                 f"{ours.concurrent_output_tps / figures.concurrent_output_tps:.2f}x",
                 f"{ours.ttft_p50_s / figures.ttft_p50_s:.2f}x")
        print("| " + " | ".join(cells) + " |")
