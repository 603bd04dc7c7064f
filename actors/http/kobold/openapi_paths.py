"""The Kobold routes' part of /openapi.json (actors/http/openapi.py merges it in). The renamed and
same-named fields take their schema from the sampling parameter they become, so their ranges stay
the sampler's; the rest are written here as fields.py reads them."""

from __future__ import annotations

from typing import Any

from actors.http.kobold.fields import NEUTRAL, NO_EFFECT, RENAMED, SAME_NAME

Schema = dict[str, Any]

_INT: Schema = {"type": ["integer", "null"]}
_BOOL: Schema = {"type": ["boolean", "null"]}
_NUMBER: Schema = {"type": ["number", "null"], "minimum": 0}
_TRANSLATED: dict[str, Schema] = {
    "prompt": {"type": "string"},
    "max_context_length": {"type": "integer", "minimum": 1,
                           "description": "the prompt keeps its last max_context_length - max_length tokens"},
    "genkey": {"type": ["string", "null"], "pattern": r"^[A-Za-z0-9._:-]{1,128}$",
               "description": "the name /api/extra/abort cancels by"},
    "rep_pen_range": {**_INT, "minimum": 0, "description": "0 or at least the context (see docs/kobold.md)"},
    "rep_pen_slope": {**_NUMBER, "description": "no effect with rep_pen_range 0; else must be 1"},
    "dynatemp_range": {**_NUMBER, "description": "dynamic temperature over temperature +- range"},
    "sampler_seed": {**_INT, "description": "-1: a fresh seed"},
    "trim_stop": _BOOL, "singleline": _BOOL, "use_default_badwordsids": {**_BOOL, "description": "bans EOS"},
    "render_special": _BOOL, "sampler_full_determinism": {**_BOOL, "description": "true needs sampler_seed"},
    "grammar": {"type": ["string", "null"], "description": "GBNF; empty: none"},
    # Kobold's off values: top_k 0, and (as Aphrodite reads them) top_p and typical 0
    "top_k": {**_INT, "minimum": -1, "description": "0 or -1: off"},
    "top_p": {**_NUMBER, "maximum": 1, "description": "0 or 1: off"},
    "typical": {**_NUMBER, "maximum": 1, "description": "0 or 1: off"},
    "sampler_order": {"type": ["array", "null"], "items": {"type": "integer", "minimum": 0, "maximum": 6},
                      "minItems": 7, "maxItems": 7, "uniqueItems": True,
                      "description": "checked against the sampler's order (docs/kobold.md)"},
}
_RESULTS: Schema = {"type": "object", "required": ["results"], "properties": {"results": {
    "type": "array", "items": {"type": "object", "required": ["text"], "properties": {
        "text": {"type": "string"}, "finish_reason": {"type": ["string", "null"]}}}}}}
_KOBOLD_ERROR: Schema = {"type": "object", "required": ["detail"], "properties": {"detail": {
    "type": "object", "required": ["msg", "type"], "properties": {
        "msg": {"type": "string"}, "type": {"type": "string"}, "param": {"type": ["string", "null"]}}}}}
_VALUE: Schema = {"type": "object", "properties": {"value": {"type": ["integer", "null"]}}}
_RESULT: Schema = {"type": "object", "properties": {"result": {"type": "string"}}}


def generate_body(sampling: dict[str, Schema]) -> Schema:
    """A Kobold generate body; `sampling`: the sampling parameters' property schemas."""
    properties = {kobold: sampling[ours] for kobold, ours in RENAMED.items()}
    properties["max_length"] = {"type": "integer", "minimum": 1}
    properties.update({name: sampling[name] for name in SAME_NAME})
    properties.update({name: _BOOL for name in NO_EFFECT})
    properties.update({name: {"enum": [*values, None], "description": "only this value: not supported"}
                       for name, values in NEUTRAL.items()})
    properties.update(_TRANSLATED)
    return {"type": "object", "required": ["prompt", "max_length", "max_context_length"],
            "properties": properties, "additionalProperties": False}


def kobold_paths(sampling: dict[str, Schema]) -> dict[str, Schema]:
    generate = _post("Generate (KoboldAI)", generate_body(sampling), {"application/json": {"schema": _RESULTS}})
    stream = _post("Generate, streamed as Kobold's server-sent events", generate_body(sampling),
                   {"text/event-stream": {"schema": {"type": "string"}}})
    abort = _post("Abort a generation by genkey", {"type": "object", "properties": {"genkey": {"type": "string"}}},
                  {"application/json": {"schema": {"type": "object", "properties": {"success": {"type": "boolean"}}}}})
    count = _post("Count a prompt's tokens", {"type": "object", "required": ["prompt"], "additionalProperties": False,
                                              "properties": {"prompt": {"type": "string"}}},
                  {"application/json": {"schema": _VALUE}})
    paths = {"/api/v1/generate": {"post": generate}, "/api/extra/generate/stream": {"post": stream},
             "/api/extra/abort": {"post": abort}, "/api/extra/tokencount": {"post": count},
             "/api/v1/model": {"get": _get("The model's name", _RESULT)},
             "/api/v1/info/version": {"get": _get("The KoboldAI API level", _RESULT)},
             "/api/extra/version": {"get": _get("The KoboldCpp level reported", _RESULT)},
             "/api/v1/config/max_context_length": {"get": _get("The model's context length", _VALUE)},
             "/api/v1/config/max_length": {"get": _get("The model's context length", _VALUE)}}
    return paths


def _post(summary: str, body: Schema, content: Schema) -> Schema:
    return {"summary": summary, "security": [{"apiKey": []}],
            "requestBody": {"required": True, "content": {"application/json": {"schema": body}}},
            "responses": {"200": {"description": "the answer", "content": content}, **_errors()}}


def _get(summary: str, answer: Schema) -> Schema:
    return {"summary": summary, "security": [{"apiKey": []}],
            "responses": {"200": {"description": "the answer", "content": {"application/json": {"schema": answer}}},
                          **_errors()}}


def _errors() -> Schema:
    content = {"application/json": {"schema": _KOBOLD_ERROR}}
    return {"400": {"description": "a field is invalid or cannot be honoured (detail.param names it)",
                    "content": content},
            "401": {"description": "missing or wrong API key", "content": content}}
