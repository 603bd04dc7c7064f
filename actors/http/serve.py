"""`aqueduct serve`: the HTTP gateway, embedded (engine in this process) or in front of Redis workers."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
from typing import Any

import structlog
import uvicorn

from actors.http.app import create_app
from actors.http.backends import Backend, EmbeddedBackend, RemoteBackend
from actors.http.one_send import server_config
from actors.http.options import GatewayOptions
from actors.kit import event_loop
from actors.kit.runtime import CRASH_EXIT_S, exit_after

log = structlog.get_logger(__name__)


def build_backend(args: argparse.Namespace, engine_config: Any, max_pending: int = 256) -> Backend:
    """Embedded: load the engine now, before serving anything. Gateway: only the tokenizer of --model
    (for /tokenize, /detokenize and logprob token strings); the workers must serve that model."""
    if args.redis_url:
        from actors.kit.device import load_model_tokenizer

        tokenizer, model_name = load_model_tokenizer(engine_config.model)
        adapters = [item.partition("=")[0] for item in getattr(args, "lora_modules", None) or []]
        block_size = engine_config.cache.block_size if getattr(args, "placement", "any") == "prefix" else None
        return RemoteBackend(args.redis_url, args.prefix, model_name, tokenizer, args.max_model_len, max_pending,
                             adapters, pooling=engine_config.model.runner == "pooling", placement_block_size=block_size)
    from actors.kit.device import device_thread, load_engine

    device = device_thread()
    return EmbeddedBackend(load_engine(engine_config, device), device)


def run_serve(args: argparse.Namespace, engine_config: Any, options: GatewayOptions) -> int:
    """0 after SIGTERM/SIGINT; 1 when the embedded engine died (its clients got 503s)."""
    # Each request waiting for replies holds a Redis connection: a batch's lines as well as HTTP requests.
    backend = build_backend(args, engine_config, options.max_pending + options.batches.max_lines_in_flight)
    app = create_app(backend, options)
    log.info("serving", host=args.host, port=args.port, model=backend.model_name,
             mode="gateway" if args.redis_url else "embedded")
    config = server_config(app, args.host, args.port, timeout_graceful_shutdown=10,
                           root_path=getattr(args, "root_path", ""))
    server = uvicorn.Server(config)
    if isinstance(backend, EmbeddedBackend):
        backend.on_death = lambda: _exit_after_death(server)
    event_loop.run(_serve_until_signalled(server))
    return 1 if isinstance(backend, EmbeddedBackend) and backend.died is not None else 0


async def _serve_until_signalled(server: uvicorn.Server) -> None:
    """SIGTERM/SIGINT: finish open responses, then return (exit 0, as the worker does on SIGTERM).

    uvicorn's own handling re-raises the signal after its graceful shutdown, so the process would
    die of it (exit -15) and an orchestrator would count a clean stop as a crash."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, _request_exit, server)
    server.capture_signals = contextlib.nullcontext  # type: ignore[method-assign]  # ours are installed above
    await server.serve()


def _exit_after_death(server: uvicorn.Server) -> None:
    """A process whose engine died only answers 503: exit (non-zero) for the supervisor to restart it.
    Open responses finish first (they are answered with the error at once); os._exit if anything hangs."""
    log.error("the engine died: exiting after the open responses")
    server.should_exit = True
    exit_after((server.config.timeout_graceful_shutdown or 0) + CRASH_EXIT_S, 1)


def _request_exit(server: uvicorn.Server) -> None:
    log.info("stopping: finishing open responses")
    server.should_exit = True
