"""/v1/files: upload (multipart, `purpose: batch`), list, retrieve, content, delete; each file its owner's only
(owner.py), a 404 for anyone else.

An upload takes fields `file` (the JSONL file), `purpose` (only `batch`: this server stores files for batches)
and optionally OpenAI's `expires_after[anchor]` (`created_at`) and `expires_after[seconds]` (3600 to 30 days,
the default). A file larger than --batch-max-file-bytes is a 413; its lines are checked when a batch uses it.
"""

from __future__ import annotations

import time

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from actors.http.batches.batch_request import MAX_OUTPUT_TTL_S, MIN_OUTPUT_TTL_S
from actors.http.batches.file_store import StoreFull
from actors.http.batches.listing import page
from actors.http.batches.multipart import FormPart, parse_form
from actors.http.batches.owner import owner_of
from actors.http.batches.records import FILE_TTL_S, FileRecord, is_file_id, new_file_id
from actors.http.batches.service import BatchService
from actors.http.batches.store_errors import store_errors
from actors.http.errors import ApiError, invalid
from actors.http.limits import check_api_key, off_loop_if_large, read_body_limited
from actors.http.options import GatewayOptions

FORM_OVERHEAD_BYTES = 64 * 1024  # a multipart body's boundaries and headers around the file
_FIELDS = ("file", "purpose", "expires_after[anchor]", "expires_after[seconds]")
_MAX_FILENAME_CHARS = 255


def add_file_routes(app: FastAPI, service: BatchService, options: GatewayOptions) -> None:
    @store_errors
    async def upload(request: Request) -> Response:
        check_api_key(request, options.api_key)
        owner, _ = owner_of(request, options.api_key)
        form = await _form(request, options.batches.max_file_bytes)
        record, data = _upload(form, owner, options.batches.max_file_bytes)
        try:
            await service.files.save(record, data)
        except StoreFull as error:
            raise ApiError(413, str(error), code="file_store_full") from None
        return JSONResponse(record.as_openai())

    @store_errors
    async def listing(request: Request) -> Response:
        check_api_key(request, options.api_key)
        owner, _ = owner_of(request, options.api_key)
        purpose = request.query_params.get("purpose")
        files = [file.as_openai() for file in await service.files.list(owner) if purpose in (None, file.purpose)]
        return JSONResponse(page(files, request.query_params, 10_000, 10_000, ("purpose", "limit", "order", "after")))

    @store_errors
    async def retrieve(request: Request) -> Response:
        return JSONResponse((await _stored(request, service, options)).as_openai())

    @store_errors
    async def content(request: Request) -> Response:
        record = await _stored(request, service, options)
        data = await service.files.content(record.owner, record.id)
        if data is None:  # deleted in between
            raise _not_found(record.id)
        return Response(data, media_type="application/octet-stream")

    @store_errors
    async def delete(request: Request) -> Response:
        record = await _stored(request, service, options)
        if not await service.files.delete(record.owner, record.id):
            raise _not_found(record.id)
        return JSONResponse({"id": record.id, "object": "file", "deleted": True})

    app.add_route("/v1/files", upload, methods=["POST"])
    app.add_route("/v1/files", listing, methods=["GET"])
    app.add_route("/v1/files/{file_id}", retrieve, methods=["GET"])
    app.add_route("/v1/files/{file_id}", delete, methods=["DELETE"])
    app.add_route("/v1/files/{file_id}/content", content, methods=["GET"])


async def _form(request: Request, max_file_bytes: int) -> dict[str, FormPart]:
    try:
        body = await read_body_limited(request, max_file_bytes + FORM_OVERHEAD_BYTES)
    except ApiError as error:
        if error.status == 413:
            raise _too_large(max_file_bytes) from None
        raise
    return await off_loop_if_large(len(body), parse_form, request.headers.get("content-type"), body)


def _upload(form: dict[str, FormPart], owner: str, max_file_bytes: int) -> tuple[FileRecord, bytes]:
    unknown = sorted(name for name in form if name not in _FIELDS)
    if unknown:
        raise invalid(f"unknown form field(s) {', '.join(unknown)[:200]} (known: {', '.join(_FIELDS)})", unknown[0])
    file = form.get("file")
    if file is None or file.filename is None:
        raise invalid("file is required: the JSONL file, as a file part of the form", "file")
    purpose = form["purpose"].text("purpose") if "purpose" in form else None
    if purpose != "batch":
        raise invalid(f"purpose must be batch (this server stores files for batches only), got {purpose!r}",
                      "purpose")
    if len(file.data) > max_file_bytes:
        raise _too_large(max_file_bytes)
    now = int(time.time())
    record = FileRecord(id=new_file_id(), owner=owner, bytes=len(file.data), created_at=now,
                        filename=file.filename[:_MAX_FILENAME_CHARS] or "file.jsonl", purpose=purpose,
                        expires_at=now + _ttl_s(form))
    return record, file.data


def _ttl_s(form: dict[str, FormPart]) -> int:
    anchor, seconds = form.get("expires_after[anchor]"), form.get("expires_after[seconds]")
    if anchor is None and seconds is None:
        return FILE_TTL_S
    text = seconds.text("expires_after[seconds]") if seconds is not None else ""
    if anchor is None or anchor.text("expires_after[anchor]") != "created_at" or not text.isascii() \
            or not text.isdigit() or len(text) > 9 or not MIN_OUTPUT_TTL_S <= int(text) <= MAX_OUTPUT_TTL_S:
        raise invalid(f"expires_after must be anchor created_at and seconds from {MIN_OUTPUT_TTL_S} to "
                      f"{MAX_OUTPUT_TTL_S}", "expires_after")
    return int(text)


async def _stored(request: Request, service: BatchService, options: GatewayOptions) -> FileRecord:
    check_api_key(request, options.api_key)
    owner, _ = owner_of(request, options.api_key)
    file_id = request.path_params["file_id"]
    record = await service.files.load(owner, file_id) if is_file_id(file_id) else None
    if record is None:
        raise _not_found(file_id)
    return record


def _not_found(file_id: str) -> ApiError:
    return ApiError(404, f"file {file_id[:100]!r} not found (unknown, expired or deleted)", param="file_id",
                    code="not_found")


def _too_large(max_file_bytes: int) -> ApiError:
    return ApiError(413, f"the file exceeds {max_file_bytes} bytes (--batch-max-file-bytes)", param="file",
                    code="file_too_large")
