"""The gateway's transport wrapper: a response's header block goes out with its first body bytes."""

from __future__ import annotations

import asyncio
from typing import Any

from actors.http.one_send import HeadersWithBodyTransport, gateway_http_protocol

HEADERS = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n\r\n"
FIRST_CHUNK = b"1a\r\ndata: {\"token_ids\": [5]}\n\n\r\n"


class RecordingTransport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 1)}.get(name, default)


def wrapped() -> tuple[HeadersWithBodyTransport, RecordingTransport]:
    real = RecordingTransport()
    return HeadersWithBodyTransport(real), real  # type: ignore[arg-type]


async def test_headers_and_the_first_chunk_leave_in_one_write() -> None:
    transport, real = wrapped()
    transport.write(HEADERS)
    assert real.writes == []
    transport.write(FIRST_CHUNK)
    transport.write(b"0\r\n\r\n")
    assert real.writes == [HEADERS + FIRST_CHUNK, b"0\r\n\r\n"]
    await asyncio.sleep(0)
    assert real.writes == [HEADERS + FIRST_CHUNK, b"0\r\n\r\n"]  # nothing held was written twice


async def test_headers_with_no_body_yet_leave_at_the_end_of_the_step() -> None:
    transport, real = wrapped()
    transport.write(HEADERS)
    await asyncio.sleep(0)
    assert real.writes == [HEADERS]


async def test_close_writes_what_is_held_first() -> None:
    transport, real = wrapped()
    transport.write(HEADERS)
    transport.close()
    assert real.writes == [HEADERS] and real.closed


async def test_body_bytes_and_other_calls_pass_through() -> None:
    transport, real = wrapped()
    transport.write(b"HTTP/ in a body, not a header block")
    transport.writelines([b"a", b"b"])
    assert real.writes == [b"HTTP/ in a body, not a header block", b"ab"]
    assert transport.get_extra_info("peername") == ("127.0.0.1", 1)


def test_the_server_uses_the_wrapping_protocol_when_httptools_is_installed() -> None:
    protocol = gateway_http_protocol()
    assert protocol == "auto" or isinstance(protocol, type)
