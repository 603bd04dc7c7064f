"""A batch's input file read as requests: each non-blank line one request with its place in the file, a bad
envelope that line's error, and what makes the file unusable (no request, too many, a custom_id twice) an error
for the whole file."""

from __future__ import annotations

import pytest

from actors.http.batches.input_lines import InputFileError, line_body, scan_lines
from tests.support.batch_helpers import chat_line, jsonl


def test_each_non_blank_line_is_a_request_in_file_order() -> None:
    data = b"\n" + jsonl([chat_line("a", "x"), chat_line("b", "y")]).replace(b"\n", b"\r\n", 1) + b"   \n"
    lines = scan_lines(data, max_lines=10)
    assert [(line.index, line.number, line.custom_id, line.error) for line in lines] == [(0, 2, "a", None),
                                                                                       (1, 3, "b", None)]
    assert line_body(data, lines[1])["messages"][0]["content"] == "y"
    assert data[lines[0].start:lines[0].end].endswith(b"}")  # the \r before the \n is not part of it


def test_a_last_line_without_a_newline_counts() -> None:
    assert [line.custom_id for line in scan_lines(jsonl([chat_line("a", "x")]).rstrip(b"\n"), 5)] == ["a"]


@pytest.mark.parametrize("text, error", [
    (b'{"custom_id": "a"', "not valid JSON"),
    (b"\xff\xfe", "not valid JSON"),
    (b"[1]", "must be a JSON object"),
    (b'{"custom_id": "", "url": "/v1/completions", "body": {}}', "custom_id must be a non-empty string"),
    (b'{"custom_id": "a", "url": "/v1/completions", "body": {}, "extra": 1}', "unknown line field(s): extra"),
    (b'{"custom_id": "a", "method": "PUT", "url": "/v1/completions", "body": {}}', "method must be POST"),
    (b'{"custom_id": "a", "url": "/v1/responses", "body": {}}', "url must be one of"),
    (b'{"custom_id": "a", "url": "/v1/completions", "body": "x"}', "body must be a JSON object"),
    (b'{"custom_id": "a", "url": "/v1/completions", "body": ' + b"[" * 100 + b"]" * 100 + b"}", "nested"),
])
def test_a_bad_envelope_is_that_line_s_error(text: bytes, error: str) -> None:
    [line] = scan_lines(text + b"\n", 5)
    assert line.error is not None and error in line.error


@pytest.mark.parametrize("data, message", [
    (b"", "holds no request"),
    (b"\n \n", "holds no request"),
    (jsonl([chat_line(f"c{i}", "x") for i in range(4)]), "more than 3 requests"),
    (jsonl([chat_line("a", "x"), chat_line("a", "y")]), "appears on lines 1 and 2"),
])
def test_a_file_that_cannot_be_a_batch(data: bytes, message: str) -> None:
    with pytest.raises(InputFileError, match=message):
        scan_lines(data, max_lines=3)
