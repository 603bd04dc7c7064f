"""The HTTP gateway fuzzed in-process by schemathesis from its own OpenAPI document (GET /openapi.json):
every generated body, valid or not, and bodies with JSON schemathesis never writes (lone surrogates, numbers
beyond 64 bits, deep nesting) get an answer below 500 within 10 s, a 4xx in OpenAI's error shape, and the
engine still serves afterwards. The Anthropic routes (/v1/messages...) are held to the same in Anthropic's error
shape. The long run is benchmarks/fuzz_gateway.py."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis import GenerationMode
from schemathesis.python import asgi

from actors.http.openapi import openapi_document
from tests.support.gateway_fuzz import (
    ANTHROPIC_CHECKS,
    AUTH,
    CHECKS,
    HANG_S,
    Edged,
    OneLifespan,
    check_answer,
    edged_bodies,
    fuzz_app,
    fuzz_backend,
    tame,
)

EXAMPLES = 60  # per operation, valid and invalid bodies together, after schemathesis' coverage phase
EDGED_EXAMPLES = 100
# No shrinking: the engine has state, and once a request has broken it every later one fails too, so a
# shrunk example would blame an innocent request. Failures are reported as drawn (the first one, in CI).
UNSHRUNK = (Phase.explicit, Phase.reuse, Phase.generate)

# Loaded from the module, not from GET /openapi.json: schemathesis' fixture loader (from_fixture) fails on
# pytest 9 (it sets Function._nodeid); test_the_served_document_is_the_module_s checks they are the same.
# The KoboldAI routes (/api/...) answer in Kobold's shapes, which CHECKS do not read: they get a fuzz of
# their own below that asks only for an answer below 500 in time (their shapes: tests/actors/http/kobold/test_api.py).
# The Anthropic routes (/v1/messages...) answer in Anthropic's error shape: ANTHROPIC_CHECKS, below.
schema = schemathesis.openapi.from_dict(openapi_document()).exclude(path_regex="^/api/|^/v1/messages")
kobold_schema = schemathesis.openapi.from_dict(openapi_document()).include(path_regex="^/api/")
KOBOLD_EXAMPLES = 25
anthropic_schema = schemathesis.openapi.from_dict(openapi_document()).include(path_regex="^/v1/messages")
ANTHROPIC_EXAMPLES = 60


@pytest.fixture(scope="module")
def gateway(default_model_path: Path) -> Iterator[OneLifespan]:
    backend = fuzz_backend(default_model_path)
    app = OneLifespan(fuzz_app(backend), backend)
    yield app
    app.close()


def test_the_served_document_is_the_module_s(gateway: OneLifespan) -> None:
    with asgi.get_client(gateway) as client:
        assert client.get("/openapi.json").json() == openapi_document()


@schema.parametrize()
@settings(max_examples=EXAMPLES, suppress_health_check=list(HealthCheck), phases=UNSHRUNK)
def test_every_request_is_answered_below_500_in_time(case: schemathesis.Case, gateway: OneLifespan) -> None:
    tame(case)
    case.call_and_validate(headers=AUTH, timeout=HANG_S, checks=CHECKS, app=gateway)
    gateway.assert_up()


@kobold_schema.parametrize()
@settings(max_examples=KOBOLD_EXAMPLES, suppress_health_check=list(HealthCheck), phases=UNSHRUNK)
def test_every_kobold_request_is_answered_below_500_in_time(case: schemathesis.Case, gateway: OneLifespan) -> None:
    if isinstance(case.body, dict) and isinstance(case.body.get("max_length"), int):
        case.body["max_length"] = min(case.body["max_length"], 8)  # short outputs: the time goes into requests
    started = time.monotonic()
    answer = case.call(headers=AUTH, timeout=HANG_S, app=gateway)
    assert time.monotonic() - started < HANG_S, f"no answer within {HANG_S:g} s"
    assert answer.status_code < 500, f"{answer.status_code}: {answer.text[:500]}"
    gateway.assert_up()


@anthropic_schema.parametrize()
@settings(max_examples=ANTHROPIC_EXAMPLES, suppress_health_check=list(HealthCheck), phases=UNSHRUNK)
def test_every_anthropic_request_is_answered_below_500_in_time(case: schemathesis.Case, gateway: OneLifespan) -> None:
    tame(case)
    case.call_and_validate(headers=AUTH, timeout=HANG_S, checks=ANTHROPIC_CHECKS, app=gateway)
    gateway.assert_up()


# The operations that take a body (cancel takes none).
bodied_schema = schema.include(method="POST").exclude(path_regex="/cancel$")


@given(edged=edged_bodies(bodied_schema.as_strategy(GenerationMode.POSITIVE)))
@settings(max_examples=EDGED_EXAMPLES, suppress_health_check=list(HealthCheck), deadline=None, phases=UNSHRUNK)
def test_json_no_library_writes_is_answered_below_500(edged: Edged, gateway: OneLifespan) -> None:
    try:
        with asgi.get_client(gateway) as client:
            started = time.monotonic()
            answer = client.post(edged.path, data=edged.raw, headers={**AUTH, "Content-Type": "application/json"},
                                 timeout=HANG_S)
        assert time.monotonic() - started < HANG_S, f"no answer within {HANG_S:g} s"
        check_answer(answer.status_code, answer.headers.get("content-type", ""), answer.content)
        gateway.assert_up()
    except Exception as error:  # in-process, the app's own exception arrives here (Starlette re-raises it)
        error.add_note(f"the request: {edged!r}")
        raise


def test_a_reused_request_id_with_another_body_is_answered_at_once(gateway: OneLifespan) -> None:
    """Fresh ids keep the fuzz's cases apart; this is the reuse they leave out (it hung once: the second
    request waited for its n choices on the first one's reply stream)."""
    with asgi.get_client(gateway) as client:
        headers = {**AUTH, "X-Request-Id": "fuzz-reused-id"}
        first = client.post("/v1/completions", json={"prompt": "Water", "max_tokens": 2}, headers=headers, timeout=2)
        assert first.status_code == 200
        again = client.post("/v1/completions", json={"prompt": "Water", "max_tokens": 2, "n": 3}, headers=headers,
                            timeout=2)
        check_answer(again.status_code, again.headers.get("content-type", ""), again.content)


def test_the_gateway_still_serves_after_the_fuzz(gateway: OneLifespan) -> None:
    with asgi.get_client(gateway) as client:
        assert client.get("/health").json() == {"status": "ok"}
        answer = client.post("/v1/completions", headers=AUTH, timeout=HANG_S,
                             json={"prompt": "Water flows", "max_tokens": 4, "temperature": 0})
        assert answer.status_code == 200, answer.text
        assert answer.json()["usage"]["completion_tokens"] == 4
