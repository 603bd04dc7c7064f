"""The Batch API's part of /openapi.json (actors/http/openapi.py merges it in): /v1/files and /v1/batches, their
bodies and query parameters as file_routes.py and batch_request.py read them, and the objects they answer with
(records.py). Errors are OpenAI's shape (the document's #/components/schemas/Error).
"""

from __future__ import annotations

from typing import Any

from actors.http.batches.batch_request import MAX_METADATA, MAX_OUTPUT_TTL_S, MIN_OUTPUT_TTL_S
from actors.http.batches.input_lines import URLS

Schema = dict[str, Any]

_TIME: Schema = {"type": ["integer", "null"]}
_FILE: Schema = {"type": "object", "required": ["id", "object", "bytes", "created_at", "filename", "purpose"],
                 "properties": {"id": {"type": "string"}, "object": {"const": "file"}, "bytes": {"type": "integer"},
                                "created_at": {"type": "integer"}, "filename": {"type": "string"},
                                "purpose": {"enum": ["batch", "batch_output"]}, "expires_at": _TIME}}
_COUNTS: Schema = {"type": "object", "required": ["total", "completed", "failed"],
                   "properties": {name: {"type": "integer"} for name in ("total", "completed", "failed")}}
_BATCH: Schema = {"type": "object", "required": ["id", "object", "endpoint", "input_file_id", "completion_window",
                                                 "status", "created_at", "request_counts"],
                  "properties": {"id": {"type": "string"}, "object": {"const": "batch"},
                                 "endpoint": {"enum": list(URLS)}, "input_file_id": {"type": "string"},
                                 "completion_window": {"type": "string"},
                                 "status": {"enum": ["validating", "failed", "in_progress", "finalizing", "completed",
                                                     "expired", "cancelling", "cancelled"]},
                                 "output_file_id": {"type": ["string", "null"]},
                                 "error_file_id": {"type": ["string", "null"]}, "created_at": {"type": "integer"},
                                 "expires_at": _TIME, "request_counts": _COUNTS,
                                 "errors": {"type": ["object", "null"]}, "metadata": {"type": ["object", "null"]}}}
_DELETED: Schema = {"type": "object", "required": ["id", "object", "deleted"],
                    "properties": {"id": {"type": "string"}, "object": {"const": "file"}, "deleted": {"const": True}}}
_ERRORS = {"400": "the body, a field or a query parameter is invalid (the message names it)",
           "401": "missing or wrong API key", "404": "no such file or batch (for this API key's tenant)",
           "503": "the batch store (Redis) is unreachable"}

_UPLOAD: Schema = {
    "type": "object", "required": ["file", "purpose"], "additionalProperties": False,
    "properties": {"file": {"type": "string", "format": "binary",
                            "description": "the JSONL file: one {custom_id, method, url, body} a line; at most "
                                           "--batch-max-file-bytes (64 MiB by default)"},
                   "purpose": {"const": "batch"},
                   "expires_after[anchor]": {"const": "created_at"},
                   "expires_after[seconds]": {"type": "integer", "minimum": MIN_OUTPUT_TTL_S,
                                              "maximum": MAX_OUTPUT_TTL_S,
                                              "description": "default: 30 days"}}}
_CREATE: Schema = {
    "type": "object", "required": ["input_file_id", "endpoint", "completion_window"], "additionalProperties": False,
    "properties": {
        "input_file_id": {"type": "string", "description": "a file uploaded with purpose batch"},
        "endpoint": {"enum": list(URLS), "description": "embeddings on a server started with --runner pooling; "
                                                        "completions and chat on the others. Lines may name any "
                                                        "of these urls"},
        "completion_window": {"type": "string", "pattern": "^[1-9][0-9]{0,6}[smh]$",
                              "description": "the deadline: 24h, 90m, 30s, ... (at most 168h); lines not answered "
                                             "by then are batch_expired"},
        "metadata": {"type": ["object", "null"], "maxProperties": MAX_METADATA,
                     "additionalProperties": {"type": "string", "maxLength": 512}},
        "output_expires_after": {"type": ["object", "null"], "required": ["anchor", "seconds"],
                                 "additionalProperties": False,
                                 "properties": {"anchor": {"const": "created_at"},
                                                "seconds": {"type": "integer", "minimum": MIN_OUTPUT_TTL_S,
                                                            "maximum": MAX_OUTPUT_TTL_S}}}}}


def _query(name: str, schema: Schema, description: str) -> Schema:
    return {"name": name, "in": "query", "required": False, "schema": schema, "description": description}


def _path(name: str) -> Schema:
    return {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}


def _operation(summary: str, answer: Schema, *, media: str = "application/json", errors: tuple[str, ...] = (),
               body: tuple[str, Schema] | None = None, parameters: list[Schema] | None = None) -> Schema:
    responses: Schema = {"200": {"description": "the answer", "content": {media: {"schema": answer}}}}
    for status, description in {**_ERRORS, **dict.fromkeys(errors, "")}.items():
        responses[status] = {"description": description or _EXTRA_ERRORS[status],
                             "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
    operation: Schema = {"summary": summary, "security": [{"apiKey": []}], "responses": responses}
    if body is not None:
        operation["requestBody"] = {"required": True, "content": {body[0]: {"schema": body[1]}}}
    if parameters:
        operation["parameters"] = parameters
    return operation


_EXTRA_ERRORS = {"409": "the batch is finished already",
                 "413": "the body or file is too large (--max-request-bytes, --batch-max-file-bytes), or the "
                        "store is full"}


def _list(item: Schema) -> Schema:
    return {"type": "object", "required": ["object", "data", "has_more"],
            "properties": {"object": {"const": "list"}, "data": {"type": "array", "items": item},
                           "first_id": {"type": ["string", "null"]}, "last_id": {"type": ["string", "null"]},
                           "has_more": {"type": "boolean"}}}


def batch_paths() -> dict[str, Schema]:
    after = _query("after", {"type": "string"}, "the id the previous page ended with")
    file_id, batch_id = [_path("file_id")], [_path("batch_id")]
    return {
        "/v1/files": {
            "post": _operation("Upload a batch input file (multipart/form-data)", _FILE, errors=("413",),
                               body=("multipart/form-data", _UPLOAD)),
            "get": _operation("List this tenant's files, newest first", _list(_FILE), parameters=[
                _query("purpose", {"type": "string"}, "only files of this purpose (batch, batch_output)"),
                _query("limit", {"type": "integer", "minimum": 1, "maximum": 10_000}, "default 10000"),
                _query("order", {"enum": ["asc", "desc"]}, "by creation time; default desc"), after])},
        "/v1/files/{file_id}": {"get": _operation("A file's record", _FILE, parameters=file_id),
                                "delete": _operation("Delete a file", _DELETED, parameters=file_id)},
        "/v1/files/{file_id}/content": {"get": _operation("A file's bytes", {"type": "string", "format": "binary"},
                                                          media="application/octet-stream", parameters=file_id)},
        "/v1/batches": {
            "post": _operation("Create a batch from an uploaded file", _BATCH, errors=("413",),
                               body=("application/json", _CREATE)),
            "get": _operation("List this tenant's batches, newest first", _list(_BATCH), parameters=[
                _query("limit", {"type": "integer", "minimum": 1, "maximum": 100}, "default 20"), after])},
        "/v1/batches/{batch_id}": {"get": _operation("A batch, with its request_counts", _BATCH, parameters=batch_id)},
        "/v1/batches/{batch_id}/cancel": {"post": _operation("Cancel a batch: cancelling, then cancelled", _BATCH,
                                                             errors=("409",), parameters=batch_id)},
    }
