"""A streaming `/v1/completions` client on the standard library, timing each token as it arrives.

Every server (aqueduct's, vLLM's, llama.cpp's `llama-server`) gets the same body: greedy,
`ignore_eos`, `stream_options.include_usage`. A request's output tokens are its usage's
`completion_tokens` where the server sends one, else the chunks that carried a choice (one token a
chunk on these servers). http.client in threads keeps the benchmark free of an HTTP dependency; the
client's own work is the same for every server.
"""

from __future__ import annotations

import http.client
import io
import json
import time
from dataclasses import dataclass

from actors.cli.bench_serve.workload import ServeRequest


@dataclass(frozen=True, slots=True)
class StreamTiming:
    sent: float  # perf_counter seconds
    first_token: float
    last_token: float
    tokens: int

    @property
    def ttft(self) -> float:
        return self.first_token - self.sent

    @property
    def decode_seconds(self) -> float:
        return self.last_token - self.first_token


def completion_body(model: str, request: ServeRequest) -> bytes:
    return json.dumps({"model": model, "prompt": request.prompt, "max_tokens": request.max_tokens,
                       "temperature": 0, "ignore_eos": True, "stream": True,
                       "stream_options": {"include_usage": True}}).encode()


def stream_completion(port: int, model: str, request: ServeRequest, timeout_s: float = 600) -> StreamTiming:
    """One streamed completion from the server on 127.0.0.1:`port`; RuntimeError on an HTTP error."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
    try:
        sent = time.perf_counter()
        connection.request("POST", "/v1/completions", completion_body(model, request),
                           {"Content-Type": "application/json"})
        response = connection.getresponse()
        if response.status != 200:
            raise RuntimeError(f"HTTP {response.status}: {response.read()[:300]!r}")
        return read_stream(response, sent)
    finally:
        connection.close()


def read_stream(response: http.client.HTTPResponse | io.BufferedIOBase, sent: float) -> StreamTiming:
    """The timing of one SSE completion stream, read line by line as it arrives."""
    first = last = 0.0
    chunks, usage_tokens = 0, None
    while line := response.readline():
        if not line.startswith(b"data:"):
            continue
        payload = line[5:].strip()
        if payload == b"[DONE]":
            break
        event = json.loads(payload)
        if any(_is_token(choice) for choice in event.get("choices") or ()):
            last = time.perf_counter()
            first = first or last
            chunks += 1
        if event.get("usage"):
            usage_tokens = event["usage"].get("completion_tokens")
    if not chunks:
        raise RuntimeError("the stream ended without a token")
    return StreamTiming(sent, first, last, usage_tokens if usage_tokens is not None else chunks)


def _is_token(choice: dict) -> bool:
    """A chunk carrying a token, not a closing chunk with only the finish reason (llama-server sends one)."""
    return bool(choice.get("text")) or choice.get("finish_reason") is None


def get_json(port: int, path: str, timeout_s: float = 5) -> tuple[int, object]:
    """(status, parsed body or None) of a GET; OSError when nothing answers."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        body = response.read()
        try:
            return response.status, json.loads(body)
        except ValueError:
            return response.status, None
    finally:
        connection.close()


def served_model(port: int) -> str:
    """The first model id the server lists on /v1/models (each server names its model its own way)."""
    _status, body = get_json(port, "/v1/models")
    return body["data"][0]["id"]
