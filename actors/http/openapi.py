"""The gateway's OpenAPI 3.1 document (GET /openapi.json): each protocol's paths (actors/http/openai/,
actors/http/kobold/, actors/http/anthropic/, actors/http/responses/ and actors/http/batches/
openapi_paths.py), their sampling fields read off SamplingParams (actors/http/sampling_schema.py), and the
error shape every route but Kobold's and Anthropic's answers in (actors/http/errors.py). The runtime LoRA routes
(/v1/load_lora_adapter, /v1/unload_lora_adapter, actors/http/openai/lora_openapi_paths.py) are in it only
for a server started with --enable-runtime-lora-updating, which serves them.
"""

from __future__ import annotations

import copy
from functools import cache

from actors.http.anthropic.openapi_paths import anthropic_paths
from actors.http.batches.openapi_paths import batch_paths
from actors.http.kobold.openapi_paths import kobold_paths
from actors.http.openai.lora_openapi_paths import lora_paths
from actors.http.openai.openapi_paths import openai_paths
from actors.http.responses.openapi_paths import responses_paths
from actors.http.sampling_schema import Schema, sampling_properties

_ERROR: Schema = {
    "type": "object", "required": ["error"],
    "properties": {"error": {"type": "object", "required": ["message", "type", "param", "code"], "properties": {
        "message": {"type": "string"}, "type": {"type": "string"},
        "param": {"type": ["string", "null"]}, "code": {"type": ["string", "null"]}}}},
}


@cache
def _document() -> Schema:
    return {
        "openapi": "3.1.0",
        "info": {"title": "Aqueduct", "version": "1",
                 "description": "OpenAI-compatible completions, chat and responses, and Anthropic's messages. "
                                "An unknown top-level field of a generation body is ignored and named in the "
                                "X-Ignored-Fields response header (a 400 with serve --strict-fields); elsewhere "
                                "unknown fields are a 400, and so is an integer field given a number with a "
                                "fraction part or exponent (1.0 for 1)."},
        "paths": {**openai_paths(), **kobold_paths(sampling_properties()), **anthropic_paths(sampling_properties()),
                  **responses_paths(sampling_properties()), **batch_paths()},
        "components": {"schemas": {"Error": _ERROR},
                       "securitySchemes": {"apiKey": {"type": "http", "scheme": "bearer",
                                                      "description": "when the server runs with --api-key"}}},
    }


def openapi_document(runtime_lora: bool = False) -> Schema:
    """The whole document (a fresh copy: callers may edit it); `runtime_lora`: with the LoRA routes."""
    document = copy.deepcopy(_document())
    if runtime_lora:
        document["paths"].update(lora_paths())
    return document
