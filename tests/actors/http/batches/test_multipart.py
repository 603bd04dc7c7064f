"""multipart/form-data bodies as OpenAI's SDKs (httpx) upload files: fields by name, file parts with their
filename and exact bytes; anything malformed a 400 that says what."""

from __future__ import annotations

import httpx
import pytest

from actors.http.batches.multipart import MAX_PARTS, parse_form
from actors.http.errors import ApiError


def _encoded(files: dict, data: dict) -> tuple[str, bytes]:
    request = httpx.Request("POST", "http://x/v1/files", files=files, data=data)
    return request.headers["content-type"], request.read()


def test_an_sdk_upload_parses_into_its_fields() -> None:
    payload = b'{"a": 1}\r\n--not-the-boundary\n\x00\xff'
    content_type, body = _encoded({"file": ("r\u00e9quests.jsonl", payload)}, {"purpose": "batch"})
    form = parse_form(content_type, body)
    assert form["file"].filename == "r\u00e9quests.jsonl" and form["file"].data == payload
    assert form["purpose"].filename is None and form["purpose"].text("purpose") == "batch"


def test_an_empty_file_is_a_file() -> None:
    form = parse_form(*_encoded({"file": ("empty.jsonl", b"")}, {}))
    assert form["file"].data == b""


@pytest.mark.parametrize("content_type, body, message", [
    ("application/json", b"{}", "must be multipart/form-data"),
    (None, b"", "must be multipart/form-data"),
    ("multipart/form-data", b"", "boundary"),
    ("multipart/form-data; boundary=b", b"no parts here", "holds no part"),
    ("multipart/form-data; boundary=b", b"--b\r\nContent-Disposition: form-data; name=x\r\n\r\nvalue", "closing"),
    ("multipart/form-data; boundary=b", b"--b\r\nX: y\r\n\r\nv\r\n--b--", "no Content-Disposition"),
    ("multipart/form-data; boundary=b", b"--b\r\n\r\nv\r\n--b--", "no Content-Disposition"),
    ("multipart/form-data; boundary=b", b"--b\r\nContent-Disposition: attachment\r\n\r\nv\r\n--b--", "form-data"),
    ("multipart/form-data; boundary=b", b"--b\r\nno colon\r\n\r\nv\r\n--b--", "malformed header"),
    ("multipart/form-data; boundary=b", b"--bjunk\r\n", "CRLF"),
    ("multipart/form-data; boundary=b", b"--b\r\nContent-Disposition: form-data; name=a\r\n\r\n1\r\n--b\r\n"
                                        b"Content-Disposition: form-data; name=a\r\n\r\n2\r\n--b--", "appears twice"),
])
def test_a_malformed_body_is_a_400(content_type: str | None, body: bytes, message: str) -> None:
    with pytest.raises(ApiError, match=message) as raised:
        parse_form(content_type, body)
    assert raised.value.status == 400


def test_the_number_of_parts_is_bounded() -> None:
    content_type, body = _encoded({"file": ("a.jsonl", b"")}, {f"f{i}": "x" for i in range(MAX_PARTS)})
    with pytest.raises(ApiError, match="more than"):
        parse_form(content_type, body)
