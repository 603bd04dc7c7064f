"""A batch line's body -> the request a direct call to its url would make: parsed by that route's own parser
(actors/http/openai/parse.py, embedding_request.py) with the line's wire id as its X-Request-Id, and answered
later by that route's own `ResponseShape`, so a line's response body is the one the route returns.

What a batch adds: its lines run as its owner's tenant (fair share), in the bulk lane (a line's own
`priority` when above 0, else BATCH_PRIORITY: docs/deployment.md#priorities), and end by the batch's
deadline (its completion window) when the line has no earlier one of its own (--request-timeout).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from actors.http.backends import Backend
from actors.http.batches.input_lines import CHAT_URL, EMBEDDINGS_URL
from actors.http.batches.records import BatchRecord
from actors.http.errors import invalid
from actors.http.generation.flow import ResponseShape
from actors.http.generation.request import GatewayRequest
from actors.http.openai.embedding_request import parse_embedding_body
from actors.http.openai.embeddings import EmbeddingShape
from actors.http.openai.parse import parse_body
from actors.http.openai.shapes import OpenAIShape
from actors.http.options import GatewayOptions
from actors.http.tenancy.api_keys import Tenant
from actors.http.tenancy.tenants import stamp_tenant
from queue_adapters.codec import WireRequest

BATCH_PRIORITY = 10  # a batch line's priority unless it asks for a larger one: the bulk lane


@dataclass(slots=True)
class LineRequest:
    request: GatewayRequest
    shape: ResponseShape[Any]


class LineParser:
    def __init__(self, backend: Backend, options: GatewayOptions) -> None:
        self.backend, self.options = backend, options
        self._shapes: dict[str, ResponseShape[Any]] = {
            CHAT_URL: OpenAIShape(backend, chat=True), EMBEDDINGS_URL: EmbeddingShape(backend)}
        self._completions_shape = OpenAIShape(backend, chat=False)

    def parse(self, url: str, body: Any, wire_id: str, batch: BatchRecord) -> LineRequest:
        """ApiError as the route would answer the body."""
        if url == EMBEDDINGS_URL:
            request: GatewayRequest = self._embedding(body, wire_id)
        else:
            request = self._generation(body, url == CHAT_URL, wire_id)
        for wire in request.wires:
            _as_batch_work(wire, batch)
        stamp_tenant(request.wires, Tenant(batch.tenant, batch.tenant_weight) if batch.tenant else None)
        return LineRequest(request, self._shapes.get(url, self._completions_shape))

    def _generation(self, body: Any, chat: bool, wire_id: str) -> GatewayRequest:
        options = self.options
        if getattr(self.backend, "pooling", False):  # as actors/http/openai/routes.py refuses it
            endpoint = CHAT_URL if chat else "/v1/completions"
            raise invalid(f"{endpoint} is not served by a pooling model (--runner pooling): use /v1/embeddings")
        parsed = parse_body(body, chat, self.backend.model_name, wire_id, options.request_timeout_s,
                            self.backend.adapter_names(), aliases=options.served_model_names,
                            strict_fields=options.strict_fields, tool_parser=options.tool_call_parser,
                            reasoning_parser=options.reasoning_parser,
                            template_kwargs=options.default_chat_template_kwargs)
        if parsed.stream:
            raise invalid("stream must be false in a batch line: its answer is one line of the output file",
                          "stream")
        return parsed

    def _embedding(self, body: Any, wire_id: str) -> GatewayRequest:
        if not getattr(self.backend, "pooling", False):  # as actors/http/openai/embeddings.py refuses it
            raise invalid("/v1/embeddings needs a pooling model: this server generates text; start it with "
                          "--runner pooling to serve embeddings")
        return parse_embedding_body(body, self.options.served_model_names or (self.backend.model_name,), wire_id)


def _as_batch_work(wire: WireRequest, batch: BatchRecord) -> None:
    wire.priority = wire.priority if wire.priority > 0 else BATCH_PRIORITY
    batch_deadline_ms = batch.expires_at * 1000
    wire.deadline_ms = min(wire.deadline_ms, batch_deadline_ms) if wire.deadline_ms else batch_deadline_ms
