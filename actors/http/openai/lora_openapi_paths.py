"""The runtime LoRA routes' part of /openapi.json (lora_routes.py): in the document only of a server that
mounts them (--enable-runtime-lora-updating or VLLM_ALLOW_RUNTIME_LORA_UPDATING), as the routes are.

Their bodies are vLLM's: fields other than these are ignored, as vLLM's request models ignore them; a
name's and a path's rules are the control entry's (queue_adapters/codec.py), so a 400 names them.
"""

from __future__ import annotations

from actors.http.sampling_schema import Schema
from queue_adapters.codec import MAX_KEY_LENGTH

_NAME: Schema = {"type": "string", "minLength": 1, "maxLength": MAX_KEY_LENGTH,
                 "description": "the adapter's name, as requests' `model` then name it"}
_STATUSES = {"400": "a bad body or path, a name already loaded (without load_inplace), or an adapter some "
                    "worker could not load (each worker's reason named)",
             "401": "missing or wrong API key", "413": "the body is too large",
             "404": "no worker has an adapter of that name", "503": "no worker is alive to apply it",
             "504": "some workers did not answer within --worker-timeout (named)"}


def load_lora_body() -> Schema:
    return {"type": "object", "required": ["lora_name", "lora_path"], "additionalProperties": True,
            "properties": {
                "lora_name": _NAME,
                "lora_path": {"type": "string", "minLength": 1,
                              "description": "a PEFT adapter directory on the workers' hosts, under --lora-root "
                                             "when the server has one"},
                "load_inplace": {"type": ["boolean", "null"], "default": False,
                                 "description": "true: load again under a name already loaded"}}}


def unload_lora_body() -> Schema:
    return {"type": "object", "required": ["lora_name"], "additionalProperties": True,
            "properties": {"lora_name": _NAME}}


def lora_paths() -> dict[str, Schema]:
    """The two routes' operations, by path."""
    return {"/v1/load_lora_adapter": {"post": _operation("Load a LoRA adapter on every worker", load_lora_body(),
                                                         {"400", "401", "413", "503", "504"})},
            "/v1/unload_lora_adapter": {"post": _operation("Unload a LoRA adapter from every worker",
                                                           unload_lora_body(), {"400", "401", "404", "413", "503",
                                                                                "504"})}}


def _operation(summary: str, body: Schema, statuses: set[str]) -> Schema:
    responses: Schema = {"200": {"description": "done: a line of text, as vLLM answers",
                                 "content": {"text/plain": {"schema": {"type": "string"}}}}}
    for status in sorted(statuses):
        responses[status] = {"description": _STATUSES[status],
                             "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
    return {"summary": summary, "security": [{"apiKey": []}], "responses": responses,
            "requestBody": {"required": True, "content": {"application/json": {"schema": body}}}}
