"""Helpers for gateway tests: a live uvicorn server on a free port (in a thread with its own event
loop, as `aqueduct serve` runs it), and a backend whose workers never answer."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager

import uvicorn

from actors.http.app import create_app
from actors.http.backends import Backend
from actors.http.one_send import server_config
from actors.http.options import GatewayOptions
from queue_adapters.codec import WireReply, WireRequest

API_KEY = "sk-test-key"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextmanager
def serving(backend: Backend, options: GatewayOptions) -> Iterator[str]:
    """The app on http://127.0.0.1:PORT until the block ends; yields the /v1 base URL."""
    port = free_port()
    config = server_config(create_app(backend, options), "127.0.0.1", port, timeout_graceful_shutdown=5)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name=f"gateway-{port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the gateway did not start")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


class SilentBackend:
    """Accepts requests and never answers: the gateway's view of a deployment with no live worker."""

    model_name = "silent"
    tokenizer = None
    max_model_len = 128
    worker_metrics = None

    def __init__(self) -> None:
        self.cancelled: list[str] = []

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def submit(self, request: WireRequest) -> None:
        return None

    async def submit_all(self, requests: list[WireRequest]) -> None:
        for request in requests:  # subclasses script `submit`
            await self.submit(request)

    async def replies(self, request: WireRequest) -> AsyncIterator[WireReply]:
        await asyncio.Event().wait()
        yield WireReply(id=request.id, seq=0)  # never reached

    async def cancel(self, request_id: str) -> None:
        self.cancelled.append(request_id)

    def adapter_names(self) -> list[str]:
        return []

    async def healthy(self) -> bool:
        return True

    async def workers_alive(self) -> bool:
        return False
