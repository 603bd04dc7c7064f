"""Helpers for the Batch API tests: a JSONL file of request lines, waiting for a batch to end, and its result
files read back through the official openai client."""

from __future__ import annotations

import json
import time
from typing import Any

import openai
from openai.types import Batch

ENDED = ("completed", "failed", "expired", "cancelled")


def jsonl(lines: list[dict[str, Any] | str]) -> bytes:
    """A batch file: dicts as JSON lines, strings as they are (hostile lines)."""
    return "".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines).encode()


def chat_line(custom_id: str, content: str, max_tokens: int = 4, **body: Any) -> dict[str, Any]:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
            "body": {"messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
                     "temperature": 0, **body}}


def completion_line(custom_id: str, prompt: Any, max_tokens: int = 4, **body: Any) -> dict[str, Any]:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/completions",
            "body": {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, **body}}


def submit(client: openai.OpenAI, lines: list[dict[str, Any] | str], endpoint: str = "/v1/chat/completions",
           window: str = "24h") -> Batch:
    uploaded = client.files.create(file=("requests.jsonl", jsonl(lines)), purpose="batch")
    return client.batches.create(input_file_id=uploaded.id, endpoint=endpoint,  # type: ignore[arg-type]
                                 completion_window=window)  # type: ignore[arg-type]


def wait_until(client: openai.OpenAI, batch_id: str, statuses: tuple[str, ...] = ENDED,
               timeout_s: float = 120.0) -> Batch:
    deadline = time.monotonic() + timeout_s
    while True:
        batch = client.batches.retrieve(batch_id)
        if batch.status in statuses:
            return batch
        if time.monotonic() > deadline:
            raise TimeoutError(f"batch {batch_id} is still {batch.status}")
        time.sleep(0.1)


def results(client: openai.OpenAI, batch: Batch) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(the output file's lines, the error file's lines)."""
    return _lines(client, batch.output_file_id), _lines(client, batch.error_file_id)


def _lines(client: openai.OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    return [json.loads(line) for line in client.files.content(file_id).text.splitlines()]


def by_custom_id(lines: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The lines by custom_id, checking that none appears twice (lines too broken to have one are left out)."""
    ids = [line["custom_id"] for line in lines if line["custom_id"] is not None]
    assert len(ids) == len(set(ids)), f"a custom_id answered twice: {sorted(ids)}"
    return {line["custom_id"]: line for line in lines if line["custom_id"] is not None}
