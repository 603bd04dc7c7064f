"""`aqueduct serve`: the HTTP gateway, embedded (engine in this process) or in front of Redis workers."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

import structlog
import uvicorn

from actors.http.app import create_app
from actors.http.backends import Backend, EmbeddedBackend, RemoteBackend
from actors.http.options import GatewayOptions

log = structlog.get_logger(__name__)


def build_backend(args: argparse.Namespace, engine_config: Any) -> Backend:
    """Embedded: load the engine now, before serving anything. Gateway: only the tokenizer of --model
    (for /tokenize, /detokenize and logprob token strings); the workers must serve that model."""
    if args.redis_url:
        from actors.cli import _remote_tokenizer

        tokenizer, model_name = _remote_tokenizer(args)
        return RemoteBackend(args.redis_url, args.prefix, model_name, tokenizer)
    from actors.device import device_thread, load_engine

    device = device_thread()
    return EmbeddedBackend(load_engine(engine_config, device), device)


def run_serve(args: argparse.Namespace, engine_config: Any, options: GatewayOptions) -> int:
    backend = build_backend(args, engine_config)
    app = create_app(backend, options)
    log.info("serving", host=args.host, port=args.port, model=backend.model_name,
             mode="gateway" if args.redis_url else "embedded")
    config = uvicorn.Config(app, host=args.host, port=args.port, log_config=None, access_log=False,
                            timeout_graceful_shutdown=10)
    asyncio.run(uvicorn.Server(config).serve())
    return 0
