"""A batch's result lines, in OpenAI's format:

    {"id": "batch_req_...", "custom_id": ..., "response": {"status_code", "request_id", "body"}, "error": null}
    {"id": "batch_req_...", "custom_id": ..., "response": null, "error": {"code", "message"}}

The first is a line that ran: its url's answer, 200 or not (a refusal's body is the route's error body). The
second is a line that never ran: its envelope was wrong, or the batch expired (`batch_expired`) or was cancelled
(`batch_cancelled`) before its answer came. Lines answered 200 go to the output file, all others to the error
file; a line's id is the same whoever writes it.
"""

from __future__ import annotations

import json
from typing import Any

BATCH_EXPIRED = "batch_expired"
BATCH_CANCELLED = "batch_cancelled"
_NOT_RUN = {BATCH_EXPIRED: "This request could not be executed before the completion window expired.",
            BATCH_CANCELLED: "This request was not executed because the batch was cancelled."}


def line_id(batch_id: str, index: int) -> str:
    return f"batch_req_{batch_id.removeprefix('batch_')}_{index}"


def answered_line(batch_id: str, index: int, custom_id: str | None, request_id: str, status: int,
                  body: dict[str, Any]) -> str:
    response = {"status_code": status, "request_id": request_id, "body": body}
    return _text({"id": line_id(batch_id, index), "custom_id": custom_id, "response": response, "error": None})


def error_line(batch_id: str, index: int, custom_id: str | None, code: str, message: str | None = None) -> str:
    error = {"code": code, "message": message or _NOT_RUN.get(code, code)}
    return _text({"id": line_id(batch_id, index), "custom_id": custom_id, "response": None, "error": error})


def kept(line: str, ok: bool) -> str:
    """A result line as the stores keep it: marked for the output file (answered 200) or the error file."""
    return ("+" if ok else "-") + line


def unkept(text: str) -> tuple[bool, str]:
    """(for the output file, the line) of what `kept` made."""
    return text.startswith("+"), text[1:]


def _text(line: dict[str, Any]) -> str:
    return json.dumps(line, ensure_ascii=False, separators=(",", ":"))
