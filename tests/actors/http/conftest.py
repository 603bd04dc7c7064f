"""An embedded `aqueduct serve` (the actor graph in-process, built-in model) on a free port, one per
test module, and the official openai client pointed at it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from actors.http.backends import EmbeddedBackend
from actors.http.options import GatewayOptions
from tests.support.engine_helpers import make_engine
from tests.support.gateway_helpers import API_KEY, serving


@pytest.fixture(scope="module")
def embedded(default_model_path: Path) -> Iterator[tuple[str, EmbeddedBackend]]:
    backend = EmbeddedBackend(make_engine(default_model_path))
    with serving(backend, GatewayOptions(api_key=API_KEY)) as base_url:
        yield base_url, backend


@pytest.fixture(scope="module")
def model(embedded: tuple[str, EmbeddedBackend]) -> str:
    return embedded[1].model_name  # the model directory's name: the tests build it into a temporary cache


@pytest.fixture(scope="module")
def client(embedded: tuple[str, EmbeddedBackend]) -> openai.OpenAI:
    return openai.OpenAI(base_url=embedded[0], api_key=API_KEY, max_retries=0)
