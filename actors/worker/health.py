"""The worker's health and metrics endpoint: a small Starlette app on uvicorn, inside the worker's event loop.

GET /healthz -> 200 "ok" while the process runs; GET /readyz -> 200 when `await ready()` is true, else 503;
GET /metrics -> Prometheus text. Every response closes its connection (Connection: close), which is all a
probe or a scraper needs. The same HTTP stack as `aqueduct serve`: uvicorn parses the requests (a malformed
one gets its 400 there), and the readiness check has a deadline, so a hanging check is a 503, not a hang.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Awaitable, Callable, Iterator
from types import TracebackType
from typing import Self

import structlog
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route
from uvicorn.protocols.http.h11_impl import H11Protocol

from actors.worker.metrics import METRICS_CONTENT_TYPE, WorkerMetrics

log = structlog.get_logger(__name__, actor="health")

_CLOSE = {"Connection": "close"}


class _EmbeddedServer(uvicorn.Server):
    """A uvicorn server that leaves signals alone: it runs as a task of the worker, whose runtime owns
    SIGTERM/SIGINT (uvicorn's own handlers would replace the worker's and re-raise the signal on exit)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class _ProbeProtocol(H11Protocol):
    """uvicorn's h11 protocol with two guards a probe endpoint wants. A client that shuts its sending side still
    gets its answer (uvicorn would let asyncio drop the connection), or a 400 if it stopped inside the head.
    A client that sends no complete head within `timeout_keep_alive` gets a 408 and is closed, so a silent
    connection costs a socket for a bounded time."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)  # type: ignore[arg-type]
        self._head_timer = self.loop.call_later(self.timeout_keep_alive, self._head_timed_out)

    def connection_lost(self, exc: Exception | None) -> None:
        self._head_timer.cancel()
        super().connection_lost(exc)

    def eof_received(self) -> bool:
        if self.cycle is not None and not self.cycle.response_complete:
            return True  # keep the socket for the reply; Connection: close ends it afterwards
        if self.cycle is None and self.conn.trailing_data[0]:  # part of a head, then EOF
            self.conn.receive_data(b"")
            self.handle_events()  # h11 reports the incomplete head; uvicorn answers it with a 400
        return False

    def _head_timed_out(self) -> None:
        if self.cycle is None and not self.transport.is_closing():
            body = b"request head not received in time\n"
            self.transport.write(b"HTTP/1.1 408 Request Timeout\r\nContent-Type: text/plain; charset=utf-8\r\n"
                                 b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body))
            self.transport.close()


class HealthServer:
    """Serves /healthz, /readyz and /metrics; `port=0` binds a free port, readable as `.port` after start()."""

    def __init__(
        self,
        host: str,
        port: int,
        metrics: WorkerMetrics,
        ready: Callable[[], Awaitable[bool]],
        *,
        io_timeout_s: float = 5.0,
        ready_timeout_s: float = 2.0,
    ) -> None:
        self.host = host
        self.port = port
        self.metrics = metrics
        self._ready = ready
        self.io_timeout_s = io_timeout_s
        self.ready_timeout_s = ready_timeout_s
        self._server: _EmbeddedServer | None = None
        self._serving: asyncio.Task[None] | None = None

    def app(self) -> Starlette:
        routes = [Route("/healthz", self._healthz), Route("/readyz", self._readyz), Route("/metrics", self._metrics)]
        return Starlette(routes=routes, exception_handlers={404: _not_found, 405: _not_allowed})

    async def start(self) -> None:
        if self._server is not None:
            raise RuntimeError("health server already started")
        # We bind the socket ourselves: a port in use is then an OSError here, where uvicorn would sys.exit().
        sock = _bind(self.host, self.port)
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(self.app(), log_config=None, access_log=False, lifespan="off", http=_ProbeProtocol,
                                timeout_keep_alive=self.io_timeout_s,  # type: ignore[arg-type]  # a float works
                                timeout_graceful_shutdown=self.io_timeout_s)  # type: ignore[arg-type]
        self._server = _EmbeddedServer(config)
        self._serving = asyncio.create_task(self._server.serve(sockets=[sock]), name="health-server")
        while not self._server.started:
            if self._serving.done():  # failed before listening: surface its error
                self._server = None
                self._serving.result()
                raise RuntimeError("health server stopped before it started")
            await asyncio.sleep(0.01)
        log.info("health server listening", host=self.host, port=self.port)

    async def stop(self) -> None:
        """Stops listening, closes idle connections, lets in-flight responses finish; safe to call twice."""
        server, serving = self._server, self._serving
        self._server = self._serving = None
        if server is None or serving is None:
            return
        server.should_exit = True
        try:
            await serving
        except Exception:
            log.exception("health server failed while stopping")
        log.info("health server stopped", port=self.port)

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    async def _healthz(self, _: Request) -> Response:
        return _text(200, "ok")

    async def _readyz(self, _: Request) -> Response:
        try:
            async with asyncio.timeout(self.ready_timeout_s):
                is_ready = await self._ready()
        except Exception:
            log.exception("readiness check failed")
            return _text(503, "not ready: readiness check failed")
        return _text(200, "ready") if is_ready else _text(503, "not ready")

    async def _metrics(self, _: Request) -> Response:
        return Response(self.metrics.render(), media_type=METRICS_CONTENT_TYPE, headers=_CLOSE)


def _text(status: int, text: str, headers: dict[str, str] | None = None) -> Response:
    return PlainTextResponse(text + "\n", status_code=status, headers={**_CLOSE, **(headers or {})})


async def _not_found(_: Request, __: Exception) -> Response:
    return _text(404, "not found")


async def _not_allowed(_: Request, __: Exception) -> Response:
    return _text(405, "method not allowed", {"Allow": "GET"})


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.create_server((host, port), family=family)
    sock.setblocking(False)
    return sock
