"""One embedded `aqueduct serve` for the Anthropic tests (the built-in model rendering a Hermes-style tool
template, --tool-call-parser hermes, an API key), the official anthropic client pointed at it, and the
helpers that force the random-weight model's output."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import pytest

from actors.http.backends import EmbeddedBackend
from actors.http.options import GatewayOptions
from tests.support.gateway_helpers import API_KEY, serving
from tests.support.tool_templates import HERMES, engine_with_template


@pytest.fixture(scope="package")
def server(default_model_path: Path) -> Iterator[tuple[str, str]]:
    """(the server's root URL, the model's name)."""
    backend = EmbeddedBackend(engine_with_template(default_model_path, HERMES))
    with serving(backend, GatewayOptions(api_key=API_KEY, tool_call_parser="hermes")) as base_url:
        yield base_url.removesuffix("/v1"), backend.model_name


@pytest.fixture(scope="package")
def model(server: tuple[str, str]) -> str:
    return server[1]


@pytest.fixture(scope="package")
def client(server: tuple[str, str]) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server[0], api_key=API_KEY, max_retries=0)


def greedy(text: str | None = None) -> dict[str, Any]:
    """An extra_body (this SDK has no temperature argument; the API field still works): temperature 0 and,
    with `text`, a constraint that makes the model write exactly `text`."""
    return {"temperature": 0, **({"guided_regex": re.escape(text)} if text is not None else {})}
