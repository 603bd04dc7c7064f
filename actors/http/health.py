"""The worker's health and metrics endpoint: a tiny HTTP/1.1 server on asyncio streams, no web framework.

GET /healthz -> 200 "ok" while the process runs; GET /readyz -> 200 when `await ready()` is true, else 503;
GET /metrics -> Prometheus text. Each connection carries one request and is then closed (Connection: close),
which is all a probe or a scraper needs. Reading the request head, the readiness check and the write each
have a deadline, so a slow, silent or half-closed client costs one handler task for a bounded time and
never takes the server down.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from http import HTTPStatus
from types import TracebackType
from typing import Self

import structlog

from actors.metrics import METRICS_CONTENT_TYPE, WorkerMetrics

log = structlog.get_logger(__name__, actor="health")

TEXT_CONTENT_TYPE = "text/plain; charset=utf-8"
MAX_LINE_BYTES = 8192
MAX_HEADER_LINES = 100
LINGER_S = 1.0
LINGER_MAX_BYTES = 1 << 20


class BadRequest(Exception):
    """The request head is not one we can answer; `status` is what to reply."""

    def __init__(self, status: HTTPStatus, reason: str) -> None:
        super().__init__(reason)
        self.status = status


class ClientGone(Exception):
    """The client closed the connection before sending anything; there is no one to answer."""


@dataclass(frozen=True, slots=True)
class Response:
    status: HTTPStatus
    body: bytes
    content_type: str = TEXT_CONTENT_TYPE
    extra_headers: tuple[tuple[str, str], ...] = ()

    def encode(self) -> bytes:
        lines = [
            f"HTTP/1.1 {self.status.value} {self.status.phrase}",
            f"Content-Type: {self.content_type}",
            f"Content-Length: {len(self.body)}",
            "Connection: close",
            *(f"{name}: {value}" for name, value in self.extra_headers),
        ]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + self.body


def text_response(status: HTTPStatus, text: str, extra_headers: tuple[tuple[str, str], ...] = ()) -> Response:
    return Response(status, (text + "\n").encode(), extra_headers=extra_headers)


async def _read_line(reader: asyncio.StreamReader, *, first: bool) -> str:
    try:
        line = await reader.readuntil(b"\n")
    except asyncio.IncompleteReadError as exc:
        if first and not exc.partial:
            raise ClientGone from exc
        raise BadRequest(HTTPStatus.BAD_REQUEST, "connection closed inside the request head") from exc
    except asyncio.LimitOverrunError as exc:
        raise BadRequest(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "request line or header too long") from exc
    return line.decode("latin-1").rstrip("\r\n")


def parse_request_line(line: str) -> tuple[str, str]:
    """'GET /readyz?x=1 HTTP/1.1' -> ('GET', '/readyz'); anything else is a BadRequest."""
    parts = line.split(" ")
    if len(parts) != 3 or not parts[0].isalpha() or not parts[1].startswith("/") or not parts[2].startswith("HTTP/1."):
        raise BadRequest(HTTPStatus.BAD_REQUEST, "malformed request line")
    method, target, _version = parts
    return method, target.split("?", 1)[0]


async def read_request_head(reader: asyncio.StreamReader) -> tuple[str, str]:
    """Reads the request line and skips the headers (we need none); returns (method, path)."""
    method, path = parse_request_line(await _read_line(reader, first=True))
    for _ in range(MAX_HEADER_LINES):
        if not await _read_line(reader, first=False):
            return method, path
    raise BadRequest(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "too many header lines")


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
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self._routes: dict[str, Callable[[], Awaitable[Response]]] = {
            "/healthz": self._healthz,
            "/readyz": self._readyz,
            "/metrics": self._metrics,
        }

    async def start(self) -> None:
        if self._server is not None:
            raise RuntimeError("health server already started")
        self._server = await asyncio.start_server(self._handle_connection, self.host, self.port, limit=MAX_LINE_BYTES)
        # With host "localhost" or "" several sockets may be bound; with port 0 each gets its own, report the first.
        self.port = self._server.sockets[0].getsockname()[1]
        log.info("health server listening", host=self.host, port=self.port)

    async def stop(self) -> None:
        """Stops listening and cancels in-flight connections; safe to call twice."""
        server, self._server = self._server, None
        if server is None:
            return
        server.close()
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        await server.wait_closed()
        log.info("health server stopped", port=self.port)

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    async def _handle_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None  # always inside the task start_server created for this connection
        self._connections.add(task)
        try:
            response = await self._response_for(reader)
            if response is not None:
                await self._send(writer, response)
                if response.status >= HTTPStatus.BAD_REQUEST:
                    await self._linger(reader, writer)
        except Exception:
            log.exception("health connection failed")
        finally:
            self._connections.discard(task)
            await self._close(writer)

    async def _response_for(self, reader: asyncio.StreamReader) -> Response | None:
        try:
            async with asyncio.timeout(self.io_timeout_s):
                method, path = await read_request_head(reader)
        except ClientGone:
            return None
        except TimeoutError:
            return text_response(HTTPStatus.REQUEST_TIMEOUT, "request head not received in time")
        except BadRequest as exc:
            log.debug("bad health request", status=exc.status.value, reason=str(exc))
            return text_response(exc.status, str(exc))
        return await self._route(method, path)

    async def _route(self, method: str, path: str) -> Response:
        handler = self._routes.get(path)
        if handler is None:
            return text_response(HTTPStatus.NOT_FOUND, "not found")
        if method != "GET":
            return text_response(HTTPStatus.METHOD_NOT_ALLOWED, "method not allowed", extra_headers=(("Allow", "GET"),))
        return await handler()

    async def _send(self, writer: asyncio.StreamWriter, response: Response) -> None:
        try:
            writer.write(response.encode())
            async with asyncio.timeout(self.io_timeout_s):
                await writer.drain()
        except (ConnectionError, TimeoutError) as exc:
            log.debug("health client went away before the response was sent", error=repr(exc))

    async def _linger(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Drains what the client is still sending before we close: closing with unread input makes the kernel
        send a reset, which can destroy the error reply before the client reads it. Bounded in time and bytes."""
        with contextlib.suppress(ConnectionError, TimeoutError):
            if writer.can_write_eof():
                writer.write_eof()
            async with asyncio.timeout(min(LINGER_S, self.io_timeout_s)):
                discarded = 0
                while discarded < LINGER_MAX_BYTES and (chunk := await reader.read(65536)):
                    discarded += len(chunk)

    async def _close(self, writer: asyncio.StreamWriter) -> None:
        writer.close()
        with contextlib.suppress(ConnectionError, TimeoutError):
            async with asyncio.timeout(self.io_timeout_s):
                await writer.wait_closed()

    async def _healthz(self) -> Response:
        return text_response(HTTPStatus.OK, "ok")

    async def _readyz(self) -> Response:
        try:
            async with asyncio.timeout(self.ready_timeout_s):
                is_ready = await self._ready()
        except Exception:
            log.exception("readiness check failed")
            return text_response(HTTPStatus.SERVICE_UNAVAILABLE, "not ready: readiness check failed")
        if is_ready:
            return text_response(HTTPStatus.OK, "ready")
        return text_response(HTTPStatus.SERVICE_UNAVAILABLE, "not ready")

    async def _metrics(self) -> Response:
        return Response(HTTPStatus.OK, self.metrics.render(), content_type=METRICS_CONTENT_TYPE)
