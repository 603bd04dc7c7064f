"""One embedded `aqueduct serve` for the Responses tests (the built-in model rendering a Hermes-style tool
template, --tool-call-parser hermes, an API key), the official openai client pointed at it, and the
helpers that force the random-weight model's output and compare a whole response with its stream."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from openai.types.responses import Response

from actors.http.backends import EmbeddedBackend
from actors.http.options import GatewayOptions
from tests.support.gateway_helpers import API_KEY, serving
from tests.support.tool_templates import HERMES, engine_with_template


@pytest.fixture(scope="package")
def server(default_model_path: Path) -> Iterator[tuple[str, str]]:
    """(the server's /v1 URL, the model's name)."""
    backend = EmbeddedBackend(engine_with_template(default_model_path, HERMES))
    with serving(backend, GatewayOptions(api_key=API_KEY, tool_call_parser="hermes")) as base_url:
        yield base_url, backend.model_name


@pytest.fixture(scope="package")
def model(server: tuple[str, str]) -> str:
    return server[1]


@pytest.fixture(scope="package")
def client(server: tuple[str, str]) -> openai.OpenAI:
    return openai.OpenAI(base_url=server[0], api_key=API_KEY, max_retries=0)


def forced(text: str) -> dict[str, Any]:
    """An extra_body that makes the model write exactly `text` (a structured-output constraint)."""
    return {"guided_regex": re.escape(text)}


def whole_and_streamed(client: openai.OpenAI, **request: Any) -> Response:
    """The response non-streamed, checked equal (but for its ids, times and cache hits) to its stream's last event."""
    whole = client.responses.create(**request)
    events = list(client.responses.create(stream=True, **request))
    assert [event.sequence_number for event in events] == list(range(len(events)))
    assert [event.type for event in events[:2]] == ["response.created", "response.in_progress"]
    assert events[-1].type == f"response.{'completed' if whole.status == 'completed' else 'incomplete'}"
    assert without_ids(events[-1].response) == without_ids(whole)
    return whole


def without_ids(response: Response) -> dict[str, Any]:
    dumped = response.model_dump(exclude={"id", "created_at", "completed_at"})
    dumped["usage"]["input_tokens_details"].pop("cached_tokens")  # the second run hits the prefix cache
    for item in dumped["output"]:
        item.pop("id")
        if item["type"] == "function_call":
            assert item.pop("call_id").startswith("call_")
    return dumped
