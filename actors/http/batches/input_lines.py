"""A batch's input file as requests: one per non-blank line, `{"custom_id", "method", "url", "body"}` as OpenAI's
batch files (and `aqueduct batch`'s) have them.

A line whose envelope is wrong (not JSON, not an object, no custom_id, a method other than POST, a url this
server does not batch, a body that is not an object, an unknown field) is that line's error: the rest of the
file still runs. What makes the whole file unusable is a 400 when the batch is created: no request, more than
--batch-max-lines, or a custom_id on two lines (each line must be answered under its own). Scanning keeps
each line's place in the file, not its parsed body: a line is parsed again when it runs, so a large file is
not held twice.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pipeline.request.untrusted import loads_json

CHAT_URL, COMPLETIONS_URL, EMBEDDINGS_URL = "/v1/chat/completions", "/v1/completions", "/v1/embeddings"
URLS = (CHAT_URL, COMPLETIONS_URL, EMBEDDINGS_URL)
MAX_CUSTOM_ID_CHARS = 512
_ENVELOPE = ("custom_id", "method", "url", "body")


@dataclass(slots=True)
class InputLine:
    index: int  # among the file's requests, from 0: its wire id's suffix and its place in the result files
    number: int  # its line number in the file, from 1
    start: int  # its bytes in the file: data[start:end]
    end: int
    custom_id: str | None
    url: str | None = None
    error: str | None = None  # what is wrong with its envelope: answered as an error without running


class InputFileError(ValueError):
    """The file cannot be a batch (a 400 when creating it)."""


def scan_lines(data: bytes, max_lines: int) -> list[InputLine]:
    """Every request of the file, checked as far as its envelope; InputFileError for the file as a whole."""
    lines = []
    for number, start, end in _spans(data):
        if len(lines) == max_lines:
            raise InputFileError(f"the input file holds more than {max_lines} requests (--batch-max-lines)")
        lines.append(_scan_line(data[start:end], len(lines), number, start, end))
    if not lines:
        raise InputFileError("the input file holds no request (one JSON object per line)")
    _refuse_duplicates(lines)
    return lines


def line_body(data: bytes, line: InputLine) -> Any:
    """A line's `body`, parsed again (scan_lines found its envelope sound)."""
    return loads_json(data[line.start:line.end], "the line")["body"]


def _spans(data: bytes) -> Iterator[tuple[int, int, int]]:
    """(line number, start, end) of each non-blank line; a line ends at \\n (a \\r before it is dropped)."""
    start, number = 0, 1
    while True:
        newline = data.find(b"\n", start)
        end = len(data) if newline < 0 else newline
        if data[start:end].strip():
            yield number, start, end - 1 if data[end - 1:end] == b"\r" else end
        if newline < 0:
            return
        start, number = newline + 1, number + 1


def _scan_line(text: bytes, index: int, number: int, start: int, end: int) -> InputLine:
    line = InputLine(index, number, start, end, custom_id=None)
    try:
        item = loads_json(text, "the line")
    except ValueError as error:  # UntrustedValueError: not JSON, bad UTF-8, too deep, ...
        line.error = str(error)
        return line
    if not isinstance(item, dict):
        line.error = f"each line must be a JSON object, got {type(item).__name__}"
        return line
    custom_id = item.get("custom_id")
    line.custom_id = custom_id if isinstance(custom_id, str) and custom_id else None
    line.url = item.get("url") if isinstance(item.get("url"), str) else None
    line.error = _envelope_error(item)
    return line


def _envelope_error(item: dict[str, Any]) -> str | None:
    unknown = sorted(str(key) for key in item if key not in _ENVELOPE)
    custom_id, url = item.get("custom_id"), item.get("url")
    if unknown:
        return f"unknown line field(s): {', '.join(unknown)} (known: {', '.join(_ENVELOPE)})"
    if not isinstance(custom_id, str) or not custom_id:
        return "custom_id must be a non-empty string"
    if len(custom_id) > MAX_CUSTOM_ID_CHARS:
        return f"custom_id must be at most {MAX_CUSTOM_ID_CHARS} characters, got {len(custom_id)}"
    if item.get("method", "POST") != "POST":
        return f"method must be POST, got {item.get('method')!r}"
    if url not in URLS:
        return f"url must be one of {', '.join(URLS)}, got {url!r}"
    if not isinstance(item.get("body"), dict):
        return "body must be a JSON object"
    return None


def _refuse_duplicates(lines: list[InputLine]) -> None:
    first_seen: dict[str, int] = {}
    for line in lines:
        if line.custom_id is None:
            continue
        if line.custom_id in first_seen:
            raise InputFileError(f"custom_id {line.custom_id[:64]!r} appears on lines {first_seen[line.custom_id]} "
                                 f"and {line.number}: each request needs its own")
        first_seen[line.custom_id] = line.number
