"""A response's status line and headers leave in one send with its first body bytes.

uvicorn writes the header block when the app sends `http.response.start` and each body chunk when it
sends it: two sends where a streamed answer starts. A client waiting for its first token then wakes
for the headers alone, finds no token, and sleeps again until the event arrives; on a busy host each
wake-up waits for a CPU. The gateway's responses send their first body bytes right after the start
(the same event-loop step), so holding the header block until the next write costs nothing, and
whatever is held is written at the end of the step if no body follows.
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any

import uvicorn

_HEADER_BLOCK_START = b"HTTP/"
_HEADER_BLOCK_END = b"\r\n\r\n"


class HeadersWithBodyTransport:
    """Wraps a server connection's transport: a header block is held until the next write (or the end
    of the current event-loop step) and goes out with it; everything else passes through."""

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self._held: bytes | None = None
        self._flush_later: asyncio.Handle | None = None

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._held is not None:
            self._transport.write(self._take_held() + bytes(data))
        elif _is_header_block(data):
            self._held = bytes(data)
            self._flush_later = asyncio.get_running_loop().call_soon(self.flush)
        else:
            self._transport.write(data)

    def writelines(self, lines: Any) -> None:
        self.write(b"".join(lines))

    def flush(self) -> None:
        if self._held is not None and not self._transport.is_closing():
            self._transport.write(self._take_held())

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def _take_held(self) -> bytes:
        held, self._held = self._held or b"", None
        if self._flush_later is not None:
            self._flush_later.cancel()
            self._flush_later = None
        return held

    def __getattr__(self, name: str) -> Any:  # everything else is the real transport's
        return getattr(self._transport, name)


def _is_header_block(data: bytes | bytearray | memoryview) -> bool:
    return isinstance(data, bytes) and data.startswith(_HEADER_BLOCK_START) and data.endswith(_HEADER_BLOCK_END)


@functools.cache
def gateway_http_protocol() -> type[asyncio.Protocol] | str:
    """uvicorn's httptools protocol over HeadersWithBodyTransport; "auto" where httptools is missing."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:
        return "auto"

    class OneSendHttpToolsProtocol(HttpToolsProtocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            super().connection_made(HeadersWithBodyTransport(transport))  # type: ignore[arg-type]

    return OneSendHttpToolsProtocol


def server_config(app: Any, host: str, port: int, **options: Any) -> uvicorn.Config:
    """The gateway's uvicorn settings, for `aqueduct serve` and the benchmarks alike."""
    return uvicorn.Config(app, host=host, port=port, http=gateway_http_protocol(), log_config=None,
                          access_log=False, **options)
