"""Shared by tests/system/test_fuzz_gateway.py and benchmarks/fuzz_gateway.py: the in-process gateway over the
built-in model, the taming of generated cases (short outputs, fresh request ids), JSON that schemathesis
never writes (lone surrogates, numbers beyond 64 bits, deep nesting), and the properties every answer must have."""

from __future__ import annotations

import copy
import itertools
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from hypothesis import strategies as st
from schemathesis import Case, CheckContext, Response
from schemathesis.checks import max_response_time, not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)

from actors.http.app import create_app
from actors.http.backends import EmbeddedBackend
from actors.http.errors import from_engine_error
from actors.http.openai.parse import _REQUEST_ID
from actors.http.options import GatewayOptions
from tests.support.engine_helpers import make_engine
from tests.support.gateway_helpers import API_KEY

HANG_S = 10.0  # an answer slower than this is a hang (schemathesis' max_response_time default is the same)
MAX_MODEL_LEN = 128  # small, so a request the cap misses still ends soon
MAX_TOKENS = 8  # generated lengths are capped to this: a run's time goes into requests, not decoding
AUTH = {"Authorization": f"Bearer {API_KEY}"}
# Each generating route's length fields; a missing one is added (until the context is full otherwise), but
# not Anthropic's max_tokens: it is required, and a body without it is a 400 to keep.
LENGTH_FIELDS = {"/v1/completions": ("max_tokens", "max_completion_tokens"),
                 "/v1/chat/completions": ("max_tokens", "max_completion_tokens"),
                 "/v1/responses": ("max_output_tokens",), "/v1/messages": ("max_tokens",)}
_REQUIRED_LENGTH = {"/v1/messages"}
_FRESH_IDS = itertools.count()
_ERROR_FIELDS = {"message": (str,), "type": (str,), "param": (str, type(None)), "code": (str, type(None))}

# Raw JSON put in place of one value of a generated body (of the kind named): what a JSON library writes only
# by accident.
EDGES: dict[str, tuple[bytes, str]] = {
    "lone surrogate": (b'"a\\ud800"', "string"),
    "invalid UTF-8": (b'"\xff\xfe"', "string"),
    "int beyond int64": (str(2**64).encode(), "number"),
    "int below int64": (str(-(2**63) - 1).encode(), "number"),
    "float overflow": (b"1e400", "number"),
    "NaN": (b"NaN", "number"),
    "Infinity": (b"-Infinity", "number"),
    "deep arrays": (b"[" * 100_000 + b"]" * 100_000, "any"),
    "deep objects": (b'{"a":' * 50_000 + b"0" + b"}" * 50_000, "any"),
}
# Fields an edge may be added as, besides the body's own values of its kind.
_NEW_FIELDS = {"string": ("prompt", "stop", "user"), "number": ("seed", "max_tokens", "temperature"),
               "any": ("prompt", "tokens", "messages")}
# Where values reach the tokenizer or the engine: an edge lands on one of these half of the time.
_HOT_KEYS = ("prompt", "content", "text", "tokens", "stop", "seed", "max_tokens", "n", "logit_bias")
_MARK = "\x00edge\x00"


def fuzz_backend(model_dir: Path) -> EmbeddedBackend:
    return EmbeddedBackend(make_engine(model_dir, max_model_len=MAX_MODEL_LEN, max_num_seqs=32))


def fuzz_app(backend: EmbeddedBackend) -> FastAPI:
    """The gateway with an API key (so the fuzz also sees 401s, and schemathesis checks they are enforced)."""
    return create_app(backend, GatewayOptions(api_key=API_KEY))


class OneLifespan:
    """The app, with one lifespan however often schemathesis cycles it: its pytest plugin ends every ASGI
    app's lifespan after each test, and an EmbeddedBackend starts once. `close()` ends it for good."""

    def __init__(self, app: FastAPI, backend: EmbeddedBackend) -> None:
        self.app, self.backend = app, backend
        self.started = self.closing = False
        self.requests = 0  # HTTP requests served: how much a run sent

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "lifespan":
            self.requests += scope["type"] == "http"
            return await self.app(scope, receive, send)
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                if not self.started:
                    await self.backend.start()
                    self.started = True
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self.closing:
                    await self.backend.close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    def assert_up(self) -> None:
        """The engine still runs: a request that kills it fails here, not every later one by a timeout."""
        from schemathesis.python import asgi

        with asgi.get_client(self) as client:
            health = client.get("/health", timeout=HANG_S).json()
        assert health == {"status": "ok"}, f"the engine went down serving this request: /health says {health}"

    def close(self) -> None:
        from schemathesis.python import asgi

        self.closing = True
        with asgi.get_client(self):  # a lifespan to end, in the event loop the backend runs in
            pass
        asgi.shutdown_lifespans()


def tame(case: Case) -> None:
    """Short outputs and a fresh X-Request-Id for each case (see cap_generation, fresh_request_id)."""
    cap_generation(case)
    fresh_request_id(case)


def cap_generation(case: Case) -> None:
    """Lengths in (MAX_TOKENS, MAX_MODEL_LEN] and null/missing ones (until the context is full) become
    MAX_TOKENS. Longer ones are kept: the engine refuses them at once, and that refusal is a path to test."""
    body, path = case.body, case.operation.path
    if path not in LENGTH_FIELDS or not isinstance(body, dict):
        return
    given = [name for name in LENGTH_FIELDS[path] if name in body]
    if not given and path not in _REQUIRED_LENGTH:
        body[LENGTH_FIELDS[path][0]] = MAX_TOKENS
    for name in given:
        value = body[name]
        if value is None or (type(value) is int and MAX_TOKENS < value <= MAX_MODEL_LEN):
            body[name] = MAX_TOKENS


def fresh_request_id(case: Case) -> None:
    """A valid X-Request-Id gets a unique suffix: hypothesis draws the same few ids again and again, and a
    reused id is a 409 (another body) or the first request's answer (a retry), not this body's own verdict."""
    headers = case.headers or {}
    value = headers.get("X-Request-Id")
    if isinstance(value, str) and _REQUEST_ID.match(value):
        headers["X-Request-Id"] = f"{value[:100]}.{next(_FRESH_IDS)}"


@dataclass(frozen=True)
class Edged:
    path: str
    raw: bytes
    edge: str

    def __repr__(self) -> str:  # a failure report quotes it: not 200 kB of brackets
        shown = self.raw if len(self.raw) <= 600 else self.raw[:300] + b"..." + self.raw[-100:]
        return f"Edged({self.path!r}, {self.edge!r}, {shown!r} ({len(self.raw)} bytes))"


@st.composite
def edged_bodies(draw: st.DrawFn, cases: st.SearchStrategy[Case]) -> Edged:
    """A generated body with one value of the edge's kind (or a new field, or the whole body) made an EDGES entry."""
    case = draw(cases)
    cap_generation(case)
    body = case.body if isinstance(case.body, dict | list) else {}
    edge = draw(st.sampled_from(list(EDGES)))  # lone surrogate first: hypothesis draws the first most
    raw_edge, kind = EDGES[edge]
    places = [path for path, value in _places(body) if _of_kind(value, kind)]
    if isinstance(body, dict):
        places += [(name,) for name in _NEW_FIELDS[kind]]
    hot = [path for path in places if set(path[-2:]) & set(_HOT_KEYS)]
    place = draw(st.sampled_from(hot)) if hot and draw(st.booleans()) else draw(st.sampled_from(places or [()]))
    marked = json.dumps(_put(copy.deepcopy(body), place, _MARK)).encode()
    return Edged(case.operation.path, marked.replace(json.dumps(_MARK).encode(), raw_edge, 1), edge)


def _places(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], Any]]:
    """Every (path, value), containers and the root included."""
    yield path, value
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        yield from _places(item, (*path, key))


def _of_kind(value: Any, kind: str) -> bool:
    if kind == "string":
        return isinstance(value, str)
    if kind == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    return True


def _put(body: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    parent = body
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = value
    return body


def rejected_or_too_large(ctx: CheckContext, response: Response, case: Case) -> bool | None:
    """schemathesis' negative_data_rejection, where a 413 also counts as refusing the body: a generated
    body past --max-request-bytes is refused for its size before anyone reads what it violates."""
    if response.status_code == 413:
        return None
    return negative_data_rejection(ctx, response, case)


def openai_error_shape(ctx: CheckContext, response: Response, case: Case) -> bool | None:
    """A schemathesis check: see check_answer."""
    check_answer(response.status_code, response.headers.get("content-type", [""])[0], response.content)
    return None


def check_answer(status: int, content_type: str, content: bytes) -> None:
    """Below 500; a 4xx is a JSON `{"error": {message, type, param, code}}`; a 200 stream carries no server error."""
    assert status < 500, f"a server error {status}: {content[:300]!r}"
    if status >= 400:
        check_error_body(content)
    elif "text/event-stream" in content_type:
        check_stream(content)


def anthropic_error_shape(ctx: CheckContext, response: Response, case: Case) -> bool | None:
    """A schemathesis check: see check_anthropic_answer."""
    check_anthropic_answer(response.status_code, response.content)
    return None


def check_anthropic_answer(status: int, content: bytes) -> None:
    """Below 500; a 4xx is Anthropic's `{"type": "error", "error": {"type", "message"}}`, but for a 405: the
    router's, before any route, in OpenAI's shape as on every path (actors/http/app.py)."""
    assert status < 500, f"a server error {status}: {content[:300]!r}"
    if status == 405:
        return check_error_body(content)
    if status < 400:
        return None
    body = _json_body(content)
    error = body.get("error") if isinstance(body, dict) else None
    assert isinstance(body, dict) and body.get("type") == "error" and isinstance(error, dict), \
        f"a 4xx body is not {{'type': 'error', 'error': {{...}}}}: {body!r}"
    assert isinstance(error.get("type"), str) and isinstance(error.get("message"), str), \
        f"error.type or error.message missing or mistyped: {error!r}"


def _json_body(content: bytes) -> Any:
    try:
        return json.loads(content)
    except ValueError as error:
        raise AssertionError(f"a 4xx body is not JSON ({error}): {content[:200]!r}") from None


def check_error_body(content: bytes) -> None:
    body = _json_body(content)
    error = body.get("error") if isinstance(body, dict) else None
    assert isinstance(error, dict), f"a 4xx body is not {{'error': {{...}}}}: {body!r}"
    for name, kinds in _ERROR_FIELDS.items():
        assert name in error and isinstance(error[name], kinds), f"error.{name} missing or mistyped: {error!r}"


def check_stream(content: bytes) -> None:
    """An in-band error event after a 200 is one the status would have been a 4xx for, had it come first."""
    for line in content.decode("utf-8", "replace").splitlines():
        if line.startswith("data: {") and '"error"' in line:
            error = json.loads(line[len("data: "):]).get("error") or {}
            assert from_engine_error(error).status < 500, f"a stream ended in a server error: {line}"


# rejected_or_too_large: a body the document calls invalid must get a 4xx, so the document is no looser
# than the parsers. positive_data_acceptance is left out: rules across fields (min_tokens <= max_tokens,
# prompt + max_tokens within the context) make some schema-valid bodies a 400, as documented.
CHECKS: list[Any] = [not_a_server_error, max_response_time, status_code_conformance, content_type_conformance,
                     response_schema_conformance, rejected_or_too_large, openai_error_shape]
# The Anthropic routes: the same, in Anthropic's error shape.
ANTHROPIC_CHECKS: list[Any] = [*CHECKS[:-1], anthropic_error_shape]
