"""The `aqueduct` command line: batch, serve, bench, worker, submit."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

import structlog

from actors.cli.engine_args import add_engine_args, engine_config_from_args
from actors.cli.logging_setup import configure_logging
from actors.kit import event_loop
from actors.kit.process_tuning import passive_omp_wait, set_compute_threads, startup_collector_paused, tune_glibc_malloc

log = structlog.get_logger(__name__)


def _batch(args: argparse.Namespace) -> int:
    with startup_collector_paused():
        from actors.cli.batch import read_batch_file, run_embedded, run_remote, write_results
        from actors.http.serve_args import tool_parser_from_args

        lines = read_batch_file(Path(args.input), tool_parser_from_args(args))
        if not args.redis_url:
            from actors.kit.device import device_thread, load_engine

            device = device_thread()
            engine = load_engine(engine_config_from_args(args), device)
            if getattr(engine, "pooling", False):
                raise ValueError("batch files hold generation requests; a pooling model (--runner pooling) serves "
                                 "embeddings over HTTP only (aqueduct serve)")
        else:
            from actors.kit.device import load_model_tokenizer
    from tqdm import tqdm

    requests = [line.request for line in lines if line.request is not None]
    progress = tqdm(total=len(requests), disable=args.no_progress, desc="requests", unit="req")
    if args.redis_url:
        results = event_loop.run(run_remote(args.redis_url, args.prefix, requests, progress))
        tokenizer, model_name = load_model_tokenizer(engine_config_from_args(args).model)
    else:
        if args.actor_graph:
            results = event_loop.run(run_embedded(engine, requests, progress, device))
        else:
            results = _run_offline_interruptibly(device, engine, requests, progress)
        tokenizer, model_name = engine.tokenizer, engine.model_name
    progress.close()
    summary = write_results(lines, results, Path(args.output), model_name, tokenizer)
    log.info("batch done", output=args.output, **summary)
    return 0


def _run_offline_interruptibly(device: Any, engine: Any, requests: list[Any], progress: Any) -> dict[str, dict]:
    """run_offline on the device thread; Ctrl-C stops it after the current step, then re-raises
    (the device thread would otherwise run the whole file before the process could exit)."""
    import threading

    from actors.cli.batch import run_offline

    stop = threading.Event()
    future = device.submit(run_offline, engine, requests, progress, stop=stop)
    try:
        return future.result()
    except KeyboardInterrupt:
        stop.set()
        future.exception()  # wait for the loop to notice
        raise


def _bench(args: argparse.Namespace) -> int:
    from actors.cli.bench_serve.args import resolve_bench_defaults

    resolve_bench_defaults(args)
    if args.serve:
        from actors.cli.bench_serve.run import run_bench_serve

        return run_bench_serve(args)
    from actors.cli.bench import run_bench

    run_bench(args)
    return 0


def _bench_redis(args: argparse.Namespace) -> int:
    from actors.cli.bench_redis import run_bench_redis

    run_bench_redis(args)
    return 0


def _loadtest(args: argparse.Namespace) -> int:
    from actors.cli.loadtest import run_loadtest

    return run_loadtest(args)


def _worker(args: argparse.Namespace) -> int:
    if not args.redis_url:
        raise ValueError("--redis-url (or AQUEDUCT_REDIS_URL) is required")
    with startup_collector_paused():
        from actors.kit.device import device_thread, load_engine
        from actors.kit.runtime import CRASH_EXIT_S
        from actors.worker.run import WorkerOptions, run_worker

        device = device_thread()
        engine = load_engine(engine_config_from_args(args), device)  # load the model before serving anything
    options = WorkerOptions(redis_url=args.redis_url, prefix=args.prefix, name=args.name,
                            health_host=args.health_host, health_port=args.health_port,
                            drain_timeout_s=args.drain_timeout, max_in_flight=args.max_in_flight,
                            redis_edges=frozenset(filter(None, args.redis_edges.split(","))),
                            claim_idle_ms=args.claim_idle_ms, max_attempts=args.max_attempts,
                            max_queue_wait_ms=args.max_queue_wait_ms, reply_to_pattern=args.reply_to_pattern,
                            lora_root=args.lora_root, placement=args.placement,
                            placement_wait_ms=args.placement_wait_ms, crash_exit_s=CRASH_EXIT_S)
    return event_loop.run(run_worker(engine, options, device=device))


def _serve(args: argparse.Namespace) -> int:
    with startup_collector_paused():
        from actors.http.serve import run_serve
        from actors.http.serve_args import options_from_args

        config = engine_config_from_args(args)  # a gateway takes only its model (for the tokenizer)
    return run_serve(args, config, options_from_args(args))


def _submit(args: argparse.Namespace) -> int:
    import json
    import uuid

    from queue_adapters.client import SyncAqueductClient

    params = {"max_tokens": args.max_tokens, "temperature": args.temperature}
    if args.seed is not None:
        params["seed"] = args.seed
    request = {"id": args.id or uuid.uuid4().hex, "prompt": args.prompt, "params": params}
    if args.lora is not None:
        request["lora"] = args.lora
    with SyncAqueductClient(args.redis_url, args.prefix) as client:
        request_id = client.submit(request)
        if args.stream:
            for reply in client.stream(request_id, timeout_s=args.timeout):
                for choice in reply.choices:
                    sys.stdout.write(choice.text)
                sys.stdout.flush()
                if reply.error is not None:
                    sys.stdout.write(f"\nerror: {reply.error.code}: {reply.error.message}\n")
                    return 1
            sys.stdout.write("\n")
            return 0
        result = client.result(request_id, timeout_s=args.timeout)
    print(json.dumps(result, ensure_ascii=False))
    return 1 if result.get("error") else 0


def _env(name: str, default: str | None = None) -> str | None:
    import os

    return os.environ.get(name, default)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="aqueduct", description="Aqueduct LLM inference service")
    parser.add_argument("--log-level", default="INFO")
    commands = parser.add_subparsers(dest="command", required=True)
    # `aqueduct serve --log-level DEBUG` (vLLM's place for it) as well as `aqueduct --log-level DEBUG serve`
    log_level = argparse.ArgumentParser(add_help=False)
    log_level.add_argument("--log-level", default=argparse.SUPPRESS)

    from actors.cli.bench_serve.args import add_bench_serve_args
    from actors.http.serve_args import add_serve_args, add_tool_args

    batch = commands.add_parser("batch", parents=[log_level],
                                 help="run an OpenAI batch file (/v1/completions) offline")
    batch.add_argument("-i", "--input", required=True, help="input .jsonl")
    batch.add_argument("-o", "--output", required=True, help="output .jsonl")
    batch.add_argument("--no-progress", action="store_true", help="no progress bar")
    batch.add_argument("--redis-url", default=None,
                       help="submit to a running deployment instead of running the engine here")
    batch.add_argument("--actor-graph", action="store_true",
                       help="run through the worker's actor graph over memory streams (default: the engine loop)")
    batch.add_argument("--prefix", default=_env("AQUEDUCT_PREFIX", "aqueduct"), help="deployment key prefix")
    add_tool_args(batch)
    add_engine_args(batch)
    batch.set_defaults(handler=_batch)

    serve = commands.add_parser("serve", parents=[log_level],
                                 help="OpenAI-compatible HTTP server (embedded, or a gateway to Redis)")
    add_serve_args(serve, _env)
    add_engine_args(serve)
    serve.set_defaults(handler=_serve)

    bench = commands.add_parser("bench", parents=[log_level],
                                 help="synthetic throughput: this engine vs HF transformers generate")
    bench.add_argument("--num-requests", type=int, default=None, help="default 128; with --serve 32")
    bench.add_argument("--prompt-len", type=int, nargs=2, default=[16, 256], metavar=("MIN", "MAX"))
    bench.add_argument("--output-len", type=int, nargs=2, default=None, metavar=("MIN", "MAX"),
                       help="default 16 256; with --serve 128 128")
    bench.add_argument("--hf-batch-size", type=int, default=None, help="HF static batch size (default: all)")
    bench.add_argument("--skip-hf", action="store_true", help="no HF transformers baseline")
    bench.add_argument("--skip-peer", action="store_true",
                       help="no llama.cpp column (run only when llama-cpp-python is installed and the model is GGUF); "
                            "with --serve, no peer servers")
    bench.add_argument("--workload-seed", type=int, default=0)
    add_bench_serve_args(bench)
    add_engine_args(bench)
    bench.set_defaults(handler=_bench)

    bench_redis = commands.add_parser("bench-redis", parents=[log_level],
                                 help="added latency and throughput of the Redis path")
    bench_redis.add_argument("--redis-url", default=_env("AQUEDUCT_REDIS_URL", "redis://127.0.0.1:6379"))
    bench_redis.add_argument("--num-ttft", type=int, default=50, help="single requests for the latency figure")
    bench_redis.add_argument("--num-requests", type=int, default=64)
    bench_redis.add_argument("--prompt-len", type=int, nargs=2, default=[16, 256], metavar=("MIN", "MAX"))
    bench_redis.add_argument("--output-len", type=int, nargs=2, default=[16, 128], metavar=("MIN", "MAX"))
    add_engine_args(bench_redis)
    bench_redis.set_defaults(handler=_bench_redis)

    worker = commands.add_parser("worker", parents=[log_level],
                                 help="serve requests from a Redis stream (consumer group 'workers')")
    worker.add_argument("--redis-url", default=_env("AQUEDUCT_REDIS_URL"), help="env AQUEDUCT_REDIS_URL")
    worker.add_argument("--prefix", default=_env("AQUEDUCT_PREFIX", "aqueduct"), help="key prefix")
    worker.add_argument("--name", default=_env("AQUEDUCT_WORKER_NAME"),
                        help="consumer name (default: hostname-pid); env AQUEDUCT_WORKER_NAME")
    worker.add_argument("--health-port", type=int, default=None, help="serve /healthz, /readyz, /metrics")
    worker.add_argument("--health-host", default="127.0.0.1",
                        help="address of the health port (default: this host only; 0.0.0.0 for every interface)")
    worker.add_argument("--drain-timeout", type=float, default=30.0,
                        help="seconds to finish in-flight requests on SIGTERM")
    worker.add_argument("--max-in-flight", type=int, default=None,
                        help="requests held at once (default 2 x --max-num-seqs); the rest wait in Redis")
    worker.add_argument("--claim-idle-ms", type=int, default=30_000,
                        help="take over the requests of workers whose heartbeat is older than this")
    worker.add_argument("--max-attempts", type=int, default=3,
                        help="deliveries of one request before it goes to {prefix}:dead")
    worker.add_argument("--max-queue-wait-ms", type=int, default=None,
                        help="a request not started within this many ms ends with an error (default: no limit)")
    worker.add_argument("--lora-root", default=None, metavar="DIR",
                        help="load_lora control entries may only name directories under DIR (symlinks resolved); "
                             "unset, they may name any directory the worker can read (a warning says so)")
    worker.add_argument("--reply-to-pattern", default=None,
                        help="glob a request's reply_to must match, e.g. 'myapp:replies:*' (default: {prefix}:out:*); "
                             "other keys get an error reply on {prefix}:out:{id}")
    worker.add_argument("--placement", choices=("prefix", "any"), default="prefix",
                        help="prefix: take requests offered to this worker for the prefixes it caches, and publish "
                             "them (docs/deployment.md#placement); any: read the shared lanes only")
    worker.add_argument("--placement-wait-ms", type=int, default=100,
                        help="an offer its worker leaves unread this long may be taken by any worker (default 100)")
    worker.add_argument("--redis-edges", default="",
                        help="internal edges to run over Redis, comma-separated: scheduler,tensor_prep,output_events")
    add_engine_args(worker)
    worker.set_defaults(handler=_worker)

    loadtest = commands.add_parser("loadtest", parents=[log_level],
                                 help="fixed-rate load against a deployment; counts lost requests")
    loadtest.add_argument("--redis-url", default=_env("AQUEDUCT_REDIS_URL", "redis://127.0.0.1:6379"))
    loadtest.add_argument("--prefix", default=_env("AQUEDUCT_PREFIX", "aqueduct"))
    loadtest.add_argument("--rate", type=float, required=True, help="requests per second")
    loadtest.add_argument("--duration", type=float, required=True, help="seconds of submitting")
    loadtest.add_argument("--prompt-len", type=int, nargs=2, default=[16, 128], metavar=("MIN", "MAX"))
    loadtest.add_argument("--output-len", type=int, nargs=2, default=[16, 64], metavar=("MIN", "MAX"))
    loadtest.add_argument("--vocab-size", type=int, default=4096, help="token ids are drawn below this")
    loadtest.add_argument("--wait", type=float, default=120.0, help="seconds to wait for stragglers afterwards")
    loadtest.add_argument("--hostile-fraction", type=float, default=0.0, metavar="F",
                          help="this share of the entries hostile (malformed, oversized, forged); reported apart")
    loadtest.set_defaults(handler=_loadtest)

    submit = commands.add_parser("submit", parents=[log_level],
                                 help="send one request to a deployment and print the result")
    submit.add_argument("--redis-url", default=_env("AQUEDUCT_REDIS_URL", "redis://127.0.0.1:6379"))
    submit.add_argument("--prefix", default=_env("AQUEDUCT_PREFIX", "aqueduct"))
    submit.add_argument("--prompt", required=True)
    submit.add_argument("--id", default=None, help="request id (default: random)")
    submit.add_argument("--max-tokens", type=int, default=64)
    submit.add_argument("--temperature", type=float, default=0.0)
    submit.add_argument("--seed", type=int, default=None)
    submit.add_argument("--lora", default=None, help="name of a LoRA adapter the workers serve")
    submit.add_argument("--stream", action="store_true", help="print text as it arrives")
    submit.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for the answer")
    submit.set_defaults(handler=_submit)
    return parser


def main(argv: list[str] | None = None) -> int:
    passive_omp_wait()  # before anything imports torch
    args = build_parser().parse_args(argv)
    configure_logging(args.log_level)
    tune_glibc_malloc()
    try:
        if _runs_an_engine(args):
            set_compute_threads(args.cpu_threads)
        return args.handler(args)
    except (ValueError, FileNotFoundError) as error:
        log.error("failed", error=str(error))
        return 2


def _runs_an_engine(args: argparse.Namespace) -> bool:
    """Commands with the engine flags, except those that only talk to a deployment (--redis-url)."""
    return hasattr(args, "cpu_threads") and not (args.command in ("batch", "serve") and args.redis_url)


def entry_point() -> None:
    """The console script: main(), then exit without the interpreter's teardown.

    Tearing down torch's modules and objects took ~0.5 s after every command here, with nothing
    left to do: results are written and closed, and logs go to stderr unbuffered by line.
    """
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    entry_point()
