"""The OpenAPI document (actors/http/openapi.py: the sampling fields of actors/http/sampling_schema.py, the
OpenAI bodies of actors/http/openai/openapi_paths.py) against the parsers it describes: the same sampling
fields as SamplingParams, and for each field the same verdict on values at and around every documented bound."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

import jsonschema_rs
import pytest

from actors.http.openai.openapi_paths import chat_body, completion_body
from actors.http.openapi import openapi_document
from actors.http.sampling_schema import sampling_properties
from pipeline.request.param_checks import FLOAT32_MAX, INT64_MAX, INT64_MIN
from pipeline.request.sampling_params import LIST_LIMITS, SamplingParams

GATEWAY_FIELDS = {"model", "user", "stream", "stream_options", "metadata", "store", "service_tier", "priority"}
SAMPLING_FIELDS = {field.name for field in fields(SamplingParams)}
# Values that make a field's cross-field rules hold, so a verdict is about the field alone.
CONTEXT: dict[str, dict[str, Any]] = {
    "dynatemp_min": {"dynatemp_max": FLOAT32_MAX},
    "min_tokens": {"max_tokens": None},
    "length_penalty": {"use_beam_search": True, "temperature": 0, "best_of": 2},
    "early_stopping": {"use_beam_search": True, "temperature": 0, "best_of": 2},
    "use_beam_search": {"temperature": 0, "best_of": 2},
}
PROBES: list[Any] = [None, True, False, "x", "never", "", [], {}, 0, 1, -1, 2, 0.5, 1.5, -2.5, 100, 1e9,
                     INT64_MAX, INT64_MAX + 1, INT64_MIN, INT64_MIN - 1, ["a"], [""], [1], [-1], [1.5],
                     {"1": 5}, {" 7 ": -100}, {"1": 101}, {"x": 1}, [[1, 2.0]], [[1]]]
BOUND_KEYWORDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
for _, most, longest in LIST_LIMITS:  # lists at and past each size limit, strings at and past each length limit
    PROBES += [[1] * most, [1] * (most + 1), ["a"] * most, ["a"] * (most + 1), {str(i): 1 for i in range(most + 1)}]
    PROBES += [["a" * longest], ["a" * (longest + 1)], "a" * (longest + 1)] if longest else []


def test_completion_bodies_have_exactly_the_sampling_params_fields() -> None:
    assert set(completion_body()["properties"]) - GATEWAY_FIELDS - {"prompt", "echo", "suffix"} == SAMPLING_FIELDS


def test_chat_bodies_have_the_sampling_params_fields_and_chat_s_own() -> None:
    chat_only = {"top_logprobs", "max_completion_tokens", "tools", "functions", "tool_choice", "function_call",
                 "parallel_tool_calls", "chat_template_kwargs", "reasoning_effort"}
    assert set(chat_body()["properties"]) - GATEWAY_FIELDS - {"messages"} == SAMPLING_FIELDS | chat_only


# Their shape is in the document, their content (a JSON string that holds a schema, one constraint
# among several spellings) is checked in code: tested below with examples instead.
CONTENT_CHECKED = {"structured_outputs", "response_format", "guided_json", "guided_whitespace_pattern"}


@pytest.mark.parametrize("name", sorted(SAMPLING_FIELDS - CONTENT_CHECKED))
def test_the_schema_and_sampling_params_agree_on_values_around_each_bound(name: str) -> None:
    schema = sampling_properties()[name]
    validator = jsonschema_rs.Draft202012Validator(schema)
    for value in [*PROBES, *_around_bounds(schema)]:
        if _integral_float(value) and _is_integer_field(schema):
            continue  # JSON Schema's integer includes 1.0; the parsers want 1 (the document's info says so)
        documented = validator.is_valid(value)
        assert documented == _accepted(name, value), f"{name}={value!r}: the schema says {documented}"


@pytest.mark.parametrize("name, value, accepted", [
    ("guided_json", {"type": "object"}, True),
    ("guided_json", '{"type": "object"}', True),
    ("guided_json", "{not json", False),
    ("guided_json", [1], False),
    ("response_format", {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}, True),
    ("response_format", {"type": "json_object"}, True),
    ("response_format", {"type": "xml"}, False),
    ("response_format", {}, False),
    ("structured_outputs", {"regex": "a+"}, True),
    ("structured_outputs", {"choice": ["a"]}, True),
    ("structured_outputs", {"bogus": 1}, False),
    ("structured_outputs", "a+", False),
])
def test_structured_output_fields_agree_with_the_document_on_examples(name: str, value: Any, accepted: bool) -> None:
    validator = jsonschema_rs.Draft202012Validator(sampling_properties()[name])
    assert _accepted(name, value) == accepted
    if accepted:  # the document may be looser (content is checked in code), never stricter
        assert validator.is_valid(value)
    elif not isinstance(value, str) or name != "guided_json":
        assert not validator.is_valid(value)


def test_the_document_is_openapi_3_1_with_the_openai_anthropic_and_responses_routes() -> None:
    document = openapi_document()
    assert document["openapi"].startswith("3.1")
    paths = {name: path for name, path in document["paths"].items() if not name.startswith("/api/")}
    # the KoboldAI routes (/api/...): tests/actors/http/kobold/test_fields.py; the runtime LoRA routes are left out
    assert sorted(paths) == ["/detokenize", "/tokenize", "/v1/batches", "/v1/batches/{batch_id}",
                             "/v1/batches/{batch_id}/cancel", "/v1/chat/completions", "/v1/completions",
                             "/v1/embeddings", "/v1/files", "/v1/files/{file_id}", "/v1/files/{file_id}/content",
                             "/v1/messages", "/v1/messages/count_tokens", "/v1/responses",
                             "/v1/responses/{response_id}", "/v1/responses/{response_id}/cancel",
                             "/v1/responses/{response_id}/input_items"]
    for name in ["/detokenize", "/tokenize", "/v1/chat/completions", "/v1/completions", "/v1/embeddings",
                 "/v1/messages", "/v1/messages/count_tokens", "/v1/responses"]:
        assert {"200", "400", "401", "404", "413", "429", "503"} <= set(paths[name]["post"]["responses"])
    assert set(paths["/v1/responses/{response_id}"]) == {"get", "delete"}


@pytest.mark.parametrize("path, body, accepted", [
    ("/v1/messages", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}, True),
    ("/v1/messages", {"messages": [{"role": "user", "content": "Hi"}]}, False),
    ("/v1/messages", {"messages": [], "max_tokens": 4}, False),
    ("/v1/messages", {"messages": [{"role": "system", "content": "Hi"}], "max_tokens": 4}, False),
    ("/v1/messages", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "n": True}, False),
    ("/v1/messages/count_tokens", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": "x"}, True),
    ("/v1/messages/count_tokens", {"messages": [{"role": "user", "content": "Hi"}], "bogus": 1}, False),
    ("/v1/embeddings", {"input": ["Hi", [1, 2]], "encoding_format": "base64", "dimensions": 8}, True),
    ("/v1/embeddings", {"input": [""]}, False),
    ("/v1/embeddings", {"input": "Hi", "dimensions": 0}, False),
    ("/v1/embeddings", {"input": "Hi", "stream": True}, False),
    ("/v1/responses", {"input": "Hi", "max_output_tokens": 4}, True),
    ("/v1/responses", {"input": []}, False),
    ("/v1/responses", {"input": "Hi", "background": 0}, False),
    ("/v1/responses", {"input": "Hi", "top_logprobs": False}, False),
    ("/v1/responses", {"input": "Hi", "metadata": {"a": 1}}, False),
])
def test_the_new_bodies_agree_with_the_document_on_examples(path: str, body: dict[str, Any], accepted: bool) -> None:
    """The parsers' verdicts are tested with the routes (tests/actors/http/anthropic/, .../responses/)."""
    schema = openapi_document()["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert jsonschema_rs.Draft202012Validator(schema).is_valid(body) == accepted


def _accepted(name: str, value: Any) -> bool:
    try:
        SamplingParams.from_dict({**CONTEXT.get(name, {}), name: value})
    except ValueError:
        return False
    return True


def _around_bounds(schema: dict[str, Any]) -> list[Any]:
    values: list[Any] = []
    for part in [schema, *schema.get("anyOf", [])]:
        for keyword in BOUND_KEYWORDS:
            if keyword in part:
                bound = part[keyword]
                step = 1 if _is_integer_field(part) else 1e-6
                values += [bound, bound - step, bound + step]
    return values


def _is_integer_field(schema: dict[str, Any]) -> bool:
    kinds = schema.get("type", [])
    return "integer" in (kinds if isinstance(kinds, list) else [kinds]) or any(
        _is_integer_field(part) for part in schema.get("anyOf", []))


def _integral_float(value: Any) -> bool:
    return isinstance(value, float) and value.is_integer()
