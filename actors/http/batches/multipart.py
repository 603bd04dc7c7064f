"""A multipart/form-data body (RFC 7578), as OpenAI's SDKs upload files: its parts by field name.

Strict and small on purpose: the body is already in memory and bounded (--batch-max-file-bytes), a field
appears once, at most MAX_PARTS parts, and anything malformed is a 400 that says what (never a 500). Header
parameters (`name`, `filename`, a quoted or RFC 2231 `filename*`) are read by the standard library's
email.message, which knows their quoting rules.
"""

from __future__ import annotations

from dataclasses import dataclass
from email.message import Message

from actors.http.errors import invalid

MAX_PARTS = 16
_MAX_HEADER_BYTES = 8192  # one part's headers


@dataclass(slots=True)
class FormPart:
    filename: str | None  # a file part's; None for a plain field
    data: bytes

    def text(self, name: str) -> str:
        """A plain field's value; a 400 naming the field when it is not UTF-8."""
        try:
            return self.data.decode("utf-8")
        except UnicodeDecodeError:
            raise invalid(f"{name} must be UTF-8 text", name) from None


def parse_form(content_type: str | None, body: bytes) -> dict[str, FormPart]:
    """The body's parts by name; a 400 for a body that is not multipart/form-data or is malformed."""
    delimiter = b"--" + _boundary(content_type)
    view = memoryview(body)
    position = _first_part(body, delimiter)
    parts: dict[str, FormPart] = {}
    while body[position:position + 2] != b"--":  # `--` after a delimiter closes the body
        position = _after_line_end(body, position)
        end = body.find(b"\r\n" + delimiter, position)
        if end < 0:
            raise invalid("the multipart body has no closing boundary")
        name, part = _part(body, view, position, end)
        if name in parts:
            raise invalid(f"the form field {name!r} appears twice", name)
        if len(parts) == MAX_PARTS:
            raise invalid(f"the form has more than {MAX_PARTS} fields")
        parts[name] = part
        position = end + 2 + len(delimiter)
    return parts


def _boundary(content_type: str | None) -> bytes:
    message = Message()
    message["content-type"] = content_type or ""
    if message.get_content_type() != "multipart/form-data":
        raise invalid("the body must be multipart/form-data (a file upload), got "
                      f"{(content_type or 'no Content-Type')[:100]!r}")
    boundary = message.get_boundary()
    if not boundary or len(boundary) > 200 or not boundary.isascii():
        raise invalid("the multipart Content-Type needs a boundary of 1-200 ASCII characters")
    return boundary.encode("ascii")


def _first_part(body: bytes, delimiter: bytes) -> int:
    """Where the text after the first delimiter starts (a preamble before it is skipped)."""
    if body.startswith(delimiter):
        return len(delimiter)
    found = body.find(b"\r\n" + delimiter)
    if found < 0:
        raise invalid("the multipart body holds no part")
    return found + 2 + len(delimiter)


def _after_line_end(body: bytes, position: int) -> int:
    """Past the CRLF that ends a delimiter line (spaces and tabs before it are transport padding)."""
    end = body.find(b"\r\n", position)
    if end < 0 or body[position:end].strip(b" \t"):
        raise invalid("the multipart body is malformed: a boundary line must end with CRLF")
    return end + 2


def _part(body: bytes, view: memoryview, start: int, end: int) -> tuple[str, FormPart]:
    if body.startswith(b"\r\n", start):  # no headers at all
        raise invalid("a multipart part has no Content-Disposition header")
    head_end = body.find(b"\r\n\r\n", start, min(end, start + _MAX_HEADER_BYTES))
    if head_end < 0:
        raise invalid(f"a multipart part's headers must end with a blank line within {_MAX_HEADER_BYTES} bytes")
    disposition = _headers(body[start:head_end]).get("content-disposition")
    if disposition is None:
        raise invalid("a multipart part has no Content-Disposition header")
    message = Message()
    message["content-disposition"] = disposition
    name = message.get_param("name", header="content-disposition")
    if message.get_content_disposition() != "form-data" or not isinstance(name, str) or not name:
        raise invalid("a multipart part's Content-Disposition must be form-data with a name")
    return name, FormPart(message.get_filename(), bytes(view[head_end + 4:end]))


def _headers(block: bytes) -> dict[str, str]:
    headers = {}
    for line in block.decode("utf-8", "replace").split("\r\n"):
        name, colon, value = line.partition(":")
        if not colon or not name.strip():
            raise invalid(f"a multipart part has a malformed header line: {line[:100]!r}")
        headers[name.strip().lower()] = value.strip()
    return headers
