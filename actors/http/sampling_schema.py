"""The sampling parameters' JSON schemas, read off SamplingParams (its dataclass fields, its type groups
and its range table), so a new field or a changed range shows up in /openapi.json without an edit, and
a field of a kind this module does not know fails loudly. Hand-written: the bounds SamplingParams checks
in code (n, best_of, top_k, ...). Every protocol's request bodies take these (actors/http/openai/openapi_paths.py,
actors/http/kobold/openapi_paths.py).
"""

from __future__ import annotations

import copy
from dataclasses import MISSING, fields
from typing import Any

from pipeline.request import sampling_params as sp
from pipeline.request.param_checks import FLOAT32_MAX, INT64_MAX, INT64_MIN
from pipeline.request.structured_output import MAX_CHOICES, MAX_SPEC_CHARS

Schema = dict[str, Any]

INT64: Schema = {"type": "integer", "minimum": INT64_MIN, "maximum": INT64_MAX}
TOKEN_ID: Schema = {"type": "integer", "minimum": 0, "maximum": INT64_MAX}
_NON_EMPTY_STRINGS: Schema = {"type": "array", "items": {"type": "string", "minLength": 1}}
_TOKEN_ID_LIST: Schema = {"anyOf": [{"type": "array", "items": TOKEN_ID}, {"type": "null"}]}

# Bounds SamplingParams checks in code (_check_counts, _check_ranges), not in its _RANGES table.
_BOUNDS_IN_CODE: dict[str, Schema] = {
    "n": {"minimum": 1, "maximum": sp.MAX_N},
    "best_of": {"minimum": 1, "maximum": sp.MAX_N, "description": f"in [n, {sp.MAX_N}]; null: n"},
    "max_tokens": {"minimum": 0, "description": "null: until the context (max_model_len) is full; 0 scores the "
                                                "prompt only (completions with echo: true)"},
    "min_tokens": {"minimum": 0, "description": "at most max_tokens"},
    "logprobs": {"minimum": 0, "description": "at most the server's --max-logprobs"},
    "prompt_logprobs": {"minimum": 0, "description": "at most the server's --max-logprobs"},
    "truncate_prompt_tokens": {"minimum": 1},
    "mirostat_mode": {"enum": [0, 2], "description": "0: off, 2: mirostat v2"},
    "dynatemp_min": {"description": "at most dynatemp_max"},
    "length_penalty": {"description": "1 unless use_beam_search"},
    "temperature": {"description": "0 with use_beam_search"},
}
# Fields of no type group of SamplingParams: their accepted JSON shapes.
_SHAPES: dict[str, Schema] = {
    "top_k": {"anyOf": [{"const": -1}, {"type": "integer", "minimum": 1, "maximum": INT64_MAX}],
              "description": "-1: off; 0 is an error"},
    "stop": {"anyOf": [{"type": "string", "minLength": 1}, _NON_EMPTY_STRINGS, {"type": "null"}]},
    "dry_sequence_breakers": {"anyOf": [_NON_EMPTY_STRINGS, {"type": "null"}]},
    "stop_token_ids": _TOKEN_ID_LIST,
    "custom_token_bans": _TOKEN_ID_LIST,
    "logit_bias": {"anyOf": [
        {"type": "object", "propertyNames": {"pattern": r"^\s*[0-9]{1,18}\s*$"},
         "additionalProperties": {"type": "number", "minimum": -sp.MAX_LOGIT_BIAS, "maximum": sp.MAX_LOGIT_BIAS}},
        {"type": "array", "items": {"type": "array", "minItems": 2, "maxItems": 2, "prefixItems": [
            TOKEN_ID, {"type": "number", "minimum": -sp.MAX_LOGIT_BIAS, "maximum": sp.MAX_LOGIT_BIAS}]}},
        {"type": "null"}], "description": "token id (a decimal string key) -> bias"},
    "early_stopping": {"anyOf": [{"type": "boolean"}, {"const": "never"}], "description": "only with use_beam_search"},
}


def _structured_output_shapes() -> dict[str, Schema]:
    """Structured outputs (pipeline/request/structured_output.py): at most one of these per request.
    Their content (a schema, regex or grammar that compiles) is checked when the request is built."""
    longest = MAX_SPEC_CHARS
    text = {"anyOf": [{"type": "string", "minLength": 1, "maxLength": longest}, {"type": "null"}]}
    schema = {"anyOf": [{"type": "object"}, {"type": "string", "maxLength": longest}, {"type": "null"}],
                "description": "a JSON schema, as an object or a JSON string"}
    choices = {"anyOf": [{"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": MAX_CHOICES},
                         {"type": "null"}]}
    json_schema = {"type": "object", "additionalProperties": False,
                   "properties": {"name": {"type": "string"}, "description": {"type": "string"},
                                  "schema": {"type": "object"}, "strict": {"type": ["boolean", "null"]}}}
    structured_outputs = {"type": "object", "additionalProperties": False, "minProperties": 1, "properties": {
        "json": schema, "regex": text, "choice": choices, "grammar": text, "json_object": {"type": ["boolean", "null"]},
        "whitespace_pattern": text, "disable_any_whitespace": {"type": ["boolean", "null"]}},
        "description": "vLLM's form: exactly one of json, regex, choice, grammar, json_object"}
    return {
        "structured_outputs": {"anyOf": [structured_outputs, {"type": "null"}]},
        "response_format": {"anyOf": [{"type": "object", "required": ["type"], "additionalProperties": False,
                                       "properties": {"type": {"enum": ["text", "json_object", "json_schema"]},
                                                      "json_schema": json_schema}}, {"type": "null"}],
                            "description": "json_schema: its schema and an optional name (llama.cpp sends none)"},
        "guided_json": schema,
        "guided_regex": {**text, "description": "a regular expression the whole answer matches"},
        "guided_choice": {**choices, "description": "the answer is one of these strings"},
        "guided_grammar": {**text, "description": "a GBNF (llama.cpp) or Lark grammar"},
        "guided_whitespace_pattern": {**text, "description": "the whitespace a JSON answer may hold (a regex)"},
    }


_SHAPES.update(_structured_output_shapes())


def sampling_properties() -> dict[str, Schema]:
    """One property per SamplingParams field, typed and bounded as SamplingParams checks it."""
    ranges = {name: bounds for name, *bounds in sp._RANGES}
    sizes = {name: (most, longest) for name, most, longest in sp.LIST_LIMITS}
    properties = {}
    for field in fields(sp.SamplingParams):
        schema = {**_typed(field.name), **_range(*ranges.get(field.name, (None, None, False, False)))}
        schema.update(_BOUNDS_IN_CODE.get(field.name, {}))
        if field.name in sizes:
            _limit_size(schema, *sizes[field.name])
        if field.default is not MISSING:
            schema["default"] = list(field.default) if isinstance(field.default, tuple) else field.default
        properties[field.name] = _nullable(schema)  # null: not given (max_tokens: until the context is full)
    return properties


def _nullable(schema: Schema) -> Schema:
    """`schema` also accepting null (SDKs send nulls for the fields they leave unset)."""
    if "anyOf" in schema:
        if {"type": "null"} not in schema["anyOf"]:
            schema["anyOf"].append({"type": "null"})
        return schema
    if "enum" in schema and None not in schema["enum"]:
        schema["enum"] = [*schema["enum"], None]
    kind = schema.get("type")
    if isinstance(kind, str):
        schema["type"] = [kind, "null"]
    elif isinstance(kind, list) and "null" not in kind:
        schema["type"] = [*kind, "null"]
    return schema


def _typed(name: str) -> Schema:
    if name in _SHAPES:  # before the type groups: top_k is an int with a hole at 0
        return copy.deepcopy(_SHAPES[name])
    if name in sp._FLOAT_FIELDS:  # the sampler's rows are float32
        return {"type": "number", "minimum": -FLOAT32_MAX, "maximum": FLOAT32_MAX}
    if name in sp._INT_FIELDS:
        return dict(INT64)
    if name in sp._OPTIONAL_INT_FIELDS:
        return {**INT64, "type": ["integer", "null"]}
    if name in sp._BOOL_FIELDS:
        return {"type": "boolean"}
    raise ValueError(f"SamplingParams.{name} has no OpenAPI schema: give it one in actors/http/sampling_schema.py")


def _range(low: float | None, high: float | None, low_open: bool, high_open: bool) -> Schema:
    bounds: Schema = {}
    if low is not None:
        bounds["exclusiveMinimum" if low_open else "minimum"] = low
    if high is not None:
        bounds["exclusiveMaximum" if high_open else "maximum"] = high
    return bounds


def _limit_size(schema: Schema, most: int, longest: int | None) -> None:
    """LIST_LIMITS on each form a list field takes: items (or ids of a map), and characters per string."""
    for form in schema.get("anyOf", [schema]):
        if form.get("type") == "array":
            form["maxItems"] = most
            if longest is not None and form["items"].get("type") == "string":
                form["items"]["maxLength"] = longest
        elif form.get("type") == "object":
            form["maxProperties"] = most
        elif form.get("type") == "string" and longest is not None:
            form["maxLength"] = longest
