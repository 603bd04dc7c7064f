"""The gateway's own cost: the HTTP app in this process over an instant backend (no Redis, no worker), and
a raw-socket client on one keep-alive connection, so neither a client library nor the queue is measured."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import statistics
import time
from collections.abc import AsyncIterator
from typing import Any

import structlog
import uvicorn
from gateway_deployment import free_port

from actors.http.app import create_app
from actors.http.one_send import server_config
from actors.http.options import GatewayOptions
from actors.kit import event_loop
from queue_adapters.codec import WireChoice, WireReply, WireRequest, WireUsage


class InstantBackend:
    """Answers every request at once with `tokens` reply entries of one token each."""

    model_name, tokenizer, max_model_len, worker_metrics = "instant", None, 128, None

    def __init__(self, tokens: int) -> None:
        self.tokens = tokens

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def submit(self, request: WireRequest) -> None: ...

    async def submit_all(self, requests: list[WireRequest]) -> None: ...

    async def replies(self, request: WireRequest) -> AsyncIterator[WireReply]:
        for seq in range(self.tokens):
            last = seq == self.tokens - 1
            yield WireReply(id=request.id, seq=seq, choices=[WireChoice(index=0, token_ids=[5], text="x",
                                                                        finish_reason="length" if last else None)],
                            usage=WireUsage(prompt_tokens=1, completion_tokens=self.tokens) if last else None)

    async def cancel(self, request_id: str) -> None: ...

    async def healthy(self) -> bool:
        return True

    def adapter_names(self) -> list[str]:
        return []

    async def workers_alive(self) -> bool:
        return True


_FIRST_TOKEN = re.compile(rb'"token_ids": ?\[\d')


class RawStreamClient:
    """Streamed /v1/completions over one keep-alive connection with hand-written HTTP/1.1: the least
    client-side work between the gateway's bytes and the clock (no client library is measured)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def connect(cls, port: int, host: str = "127.0.0.1") -> RawStreamClient:
        return cls(*await asyncio.open_connection(host, port))

    async def first_token_ms(self, prompt: str, max_tokens: int, **params: Any) -> float:
        """Milliseconds from writing the request to reading the first chunk with a token; reads the rest."""
        body = json.dumps({"prompt": prompt, "max_tokens": max_tokens, "stream": True, **params}).encode()
        head = (f"POST /v1/completions HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode()
        started, first, received = time.perf_counter(), None, b""
        self.writer.write(head + body)
        while not received.endswith(b"0\r\n\r\n"):  # the chunked body's last chunk
            chunk = await self.reader.read(65536)
            received += chunk
            if not chunk or (len(received) >= 12 and not received.startswith(b"HTTP/1.1 200")):
                raise RuntimeError(f"the gateway answered {received[:300]!r}")  # not wait forever on a 500
            if first is None and _FIRST_TOKEN.search(received):
                first = time.perf_counter() - started
        if first is None:
            raise RuntimeError("the stream ended without a token")
        return first * 1000

    def close(self) -> None:
        self.writer.close()


async def first_token_ms(requests: int = 200, tokens: int = 4) -> tuple[float, float]:
    """(p50, p90) ms from writing a streamed /v1/completions request to reading its first token chunk."""
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))  # no per-request log
    port = free_port()
    server = uvicorn.Server(server_config(create_app(InstantBackend(tokens), GatewayOptions()), "127.0.0.1", port))
    serving = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    client = await RawStreamClient.connect(port)
    samples = [await client.first_token_ms("hi", tokens) for _ in range(requests)]
    client.close()
    server.should_exit = True
    await serving
    quantiles = statistics.quantiles(samples, n=10)
    return statistics.median(samples), quantiles[8]


if __name__ == "__main__":
    p50, p90 = event_loop.run(first_token_ms())
    print(f"the gateway alone: first token p50 {p50:.2f} ms   p90 {p90:.2f} ms")
