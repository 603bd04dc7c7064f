"""The Batch API's routes, on the same app as the OpenAI ones: /v1/files (file_routes.py) and /v1/batches
(batch_routes.py), over one BatchService, which the app starts after the backend and stops before it."""

from __future__ import annotations

from fastapi import FastAPI

from actors.http.batches.batch_routes import add_batch_routes
from actors.http.batches.file_routes import add_file_routes
from actors.http.batches.service import BatchService
from actors.http.options import GatewayOptions


def add_batch_api(app: FastAPI, service: BatchService, options: GatewayOptions) -> None:
    add_file_routes(app, service, options)
    add_batch_routes(app, service, options)
