"""/v1/batches: create, list, retrieve, cancel; each batch its owner's only (owner.py), a 404 for anyone else.

Creating one checks its body (batch_request.py) and its input file as a whole (input_lines.py: a 400 for no
request, too many, or a custom_id on two lines); the supervisor (supervisor.py) runs it from there. A cancel
is asked for here and carried out by whichever gateway runs the batch: `cancelling` until its lines in flight
are cancelled, then `cancelled`. Cancelling a finished batch is a 409.
"""

from __future__ import annotations

import asyncio
import time

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from actors.http.batches.batch_request import BatchRequest, parse_batch_request
from actors.http.batches.input_lines import InputFileError, scan_lines
from actors.http.batches.listing import page
from actors.http.batches.owner import owner_of
from actors.http.batches.records import BatchRecord, is_batch_id, is_file_id, new_batch_id
from actors.http.batches.service import BatchService
from actors.http.batches.store_errors import store_errors
from actors.http.errors import ApiError, invalid
from actors.http.limits import check_api_key, read_json_object
from actors.http.options import GatewayOptions
from actors.http.tenancy.api_keys import Tenant


def add_batch_routes(app: FastAPI, service: BatchService, options: GatewayOptions) -> None:
    @store_errors
    async def create(request: Request) -> Response:
        body = await read_json_object(request, options.api_key, options.max_request_bytes)
        owner, tenant = owner_of(request, options.api_key)
        parsed = parse_batch_request(body, getattr(service.backend, "pooling", False))
        total = await _requests_in(service, owner, parsed.input_file_id, options.batches.max_lines)
        record = _new_batch(parsed, owner, tenant, total)
        await service.batches.create(record)
        service.wake()
        return JSONResponse(record.as_openai())

    @store_errors
    async def listing(request: Request) -> Response:
        check_api_key(request, options.api_key)
        owner, _ = owner_of(request, options.api_key)
        batches = [batch.as_openai() for batch in await service.batches.list(owner)]
        return JSONResponse(page(batches, request.query_params, 20, 100))

    @store_errors
    async def retrieve(request: Request) -> Response:
        return JSONResponse((await _stored(request, service, options)).as_openai())

    @store_errors
    async def cancel(request: Request) -> Response:
        record = await _stored(request, service, options)
        if record.finished:
            raise ApiError(409, f"batch {record.id!r} is {record.status}: only a batch not finished can be cancelled",
                           code="batch_not_cancellable")
        await service.batches.request_cancel(record.id, int(time.time()))
        service.wake()
        return JSONResponse((await _stored(request, service, options)).as_openai())

    app.add_route("/v1/batches", create, methods=["POST"])
    app.add_route("/v1/batches", listing, methods=["GET"])
    app.add_route("/v1/batches/{batch_id}", retrieve, methods=["GET"])
    app.add_route("/v1/batches/{batch_id}/cancel", cancel, methods=["POST"])


async def _requests_in(service: BatchService, owner: str, file_id: str, max_lines: int) -> int:
    """How many requests the input file holds; a 404 when the owner has no such file, a 400 when it cannot be
    a batch."""
    record = await service.files.load(owner, file_id) if is_file_id(file_id) else None
    data = await service.files.content(owner, file_id) if record is not None else None
    if record is None or data is None:
        raise ApiError(404, f"file {file_id[:100]!r} not found (unknown, expired or deleted)", param="input_file_id",
                       code="not_found")
    if record.purpose != "batch":
        raise invalid(f"input_file_id must name a file uploaded with purpose batch, not {record.purpose}",
                      "input_file_id")
    try:
        return len(await asyncio.to_thread(scan_lines, data, max_lines))
    except InputFileError as error:
        raise invalid(str(error), "input_file_id") from None


def _new_batch(parsed: BatchRequest, owner: str, tenant: Tenant | None, total: int) -> BatchRecord:
    now = int(time.time())
    return BatchRecord(id=new_batch_id(), owner=owner, endpoint=parsed.endpoint, input_file_id=parsed.input_file_id,
                       completion_window=parsed.completion_window, created_at=now, expires_at=now + parsed.window_s,
                       total=total, tenant=tenant.name if tenant is not None else None,
                       tenant_weight=tenant.weight if tenant is not None else 1.0, metadata=parsed.metadata,
                       output_ttl_s=parsed.output_ttl_s)


async def _stored(request: Request, service: BatchService, options: GatewayOptions) -> BatchRecord:
    check_api_key(request, options.api_key)
    owner, _ = owner_of(request, options.api_key)
    batch_id = request.path_params["batch_id"]
    record = await service.batches.load(batch_id) if is_batch_id(batch_id) else None
    if record is None or record.owner != owner:
        raise ApiError(404, f"batch {batch_id[:100]!r} not found", param="batch_id", code="not_found")
    return record
