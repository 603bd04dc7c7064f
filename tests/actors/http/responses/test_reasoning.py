"""Under --reasoning-parser the answer's reasoning is a `reasoning` output item before the message, streamed
as reasoning_text events, and the stored conversation drops it when continued (templates take no such part)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from actors.http.backends import EmbeddedBackend
from actors.http.options import GatewayOptions
from tests.actors.http.responses.conftest import forced, whole_and_streamed
from tests.support.engine_helpers import make_engine
from tests.support.gateway_helpers import API_KEY, serving


@pytest.fixture(scope="module")
def thinking(default_model_path: Path) -> Iterator[tuple[openai.OpenAI, str]]:
    backend = EmbeddedBackend(make_engine(default_model_path))
    with serving(backend, GatewayOptions(api_key=API_KEY, reasoning_parser="think")) as base_url:
        yield openai.OpenAI(base_url=base_url, api_key=API_KEY, max_retries=0), backend.model_name


def test_reasoning_is_an_item_of_its_own_before_the_message(thinking: tuple[openai.OpenAI, str]) -> None:
    client, model = thinking
    response = whole_and_streamed(client, model=model, input="2 + 2?", extra_body=forced("<think>Add.</think>4"))
    assert [item.type for item in response.output] == ["reasoning", "message"]
    assert response.output[0].id.startswith("rs_") and response.output[0].content[0].text == "Add."
    assert response.output_text == "4"
    events = [event.type for event in client.responses.create(model=model, input="2 + 2?", stream=True,
                                                              extra_body=forced("<think>Add.</think>4"))]
    assert "response.reasoning_text.delta" in events and "response.reasoning_text.done" in events
    again = client.responses.create(model=model, input="And 3 + 3?", previous_response_id=response.id,
                                    max_output_tokens=2)
    explicit = client.responses.create(model=model, max_output_tokens=2, input=[
        {"role": "user", "content": "2 + 2?"}, {"role": "assistant", "content": "4"},
        {"role": "user", "content": "And 3 + 3?"}])
    assert again.usage.input_tokens == explicit.usage.input_tokens
