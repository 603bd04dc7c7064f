"""POST /v1/embeddings (OpenAI's shape) through the generation flow: one wire request per input, each
answered by a pooling worker with its vector (little-endian float32), written back as a list of
floats or, for `encoding_format: base64`, those bytes in base64 (what OpenAI's SDK asks for by default).

A server started without --runner pooling answers 400 naming the flag, as vLLM does; a pooling server
answers completions and chat with a 400 naming the endpoint (routes.py).

As a generation request, an embedding request is cancelled when its client goes away (the flow's
cancel) and has --request-timeout as its deadline: a worker ends one not embedded by then with
`timeout`, answered 504 (`abort`, a cancel from elsewhere, 503).
"""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from actors.http.backends import Backend
from actors.http.errors import ApiError, invalid
from actors.http.generation.flow import EventWriter, Generation
from actors.http.limits import check_api_key, read_json_body
from actors.http.openai.embedding_request import EmbeddingRequest, parse_embedding_body
from actors.http.options import GatewayOptions


class EmbeddingShape:
    endpoint = "embeddings"

    def __init__(self, backend: Backend) -> None:
        self.backend = backend

    def error(self, error: ApiError) -> Response:
        return error.response()

    def answer(self, request: EmbeddingRequest, results: list[dict[str, Any]]) -> Response:
        for result in results:
            _check_embedded(result)
        data = [{"object": "embedding", "index": index,
                 "embedding": _encoded(result["embedding"], request.encoding_format)}
                for index, result in enumerate(results)]
        prompt_tokens = sum((result["usage"] or {}).get("prompt_tokens", 0) for result in results)
        return JSONResponse({"object": "list", "data": data, "model": self.backend.model_name,
                             "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}})

    def writer(self, request: EmbeddingRequest) -> EventWriter:
        raise ApiError(400, "embeddings do not stream", param="stream", code="invalid_request")


def _check_embedded(result: dict[str, Any]) -> None:
    """A worker that ended the request unembedded said why: its deadline passed, or it was cancelled."""
    reason = result["choices"][0]["finish_reason"] if result["choices"] else None
    if result["embedding"] is None and reason == "timeout":
        raise ApiError(504, "the input was not embedded within --request-timeout", code="timeout")
    if result["embedding"] is None and reason == "abort":
        raise ApiError(503, "the embedding request was cancelled before it ran", code="aborted")


def _encoded(vector: bytes | None, encoding_format: str) -> list[float] | str:
    if vector is None:
        raise ApiError(500, "the worker answered without an embedding", code="internal_error")
    if encoding_format == "base64":
        return base64.b64encode(vector).decode("ascii")
    return np.frombuffer(vector, dtype="<f4").tolist()


def add_embedding_route(app: FastAPI, generation: Generation, backend: Backend, options: GatewayOptions) -> None:
    shape = EmbeddingShape(backend)

    async def parse(request: Request) -> EmbeddingRequest:
        check_api_key(request, options.api_key)
        if not getattr(backend, "pooling", False):
            raise invalid("/v1/embeddings needs a pooling model: this server generates text; start it with "
                          "--runner pooling to serve embeddings")
        body, _ = await read_json_body(request, options.max_request_bytes)
        parsed = parse_embedding_body(body, options.served_model_names or (backend.model_name,),
                                      request.headers.get("x-request-id"), options.request_timeout_s)
        if "x-request-id" in request.headers:
            ids = [parsed.response_id, *(wire.id for wire in parsed.wires)]
            generation.claim_ids(parsed, ids, request.headers.get("authorization"), body)
        return parsed

    async def embeddings(request: Request) -> Response:
        return await generation.serve(request, parse, shape)

    app.add_route("/v1/embeddings", embeddings, methods=["POST"])
