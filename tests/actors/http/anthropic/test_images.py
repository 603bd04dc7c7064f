"""Image blocks through /v1/messages on a tiny LLaVA: a base64 source and a data: URI URL are the image an
OpenAI image_url part is (the same answer, the same prompt length), another URL is not fetched, and a
text-only model refuses images."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pytest

from actors.http.backends import EmbeddedBackend
from actors.http.options import GatewayOptions
from tests.actors.http.anthropic.conftest import greedy
from tests.support.engine_helpers import make_engine
from tests.support.gateway_helpers import API_KEY, serving
from tests.support.hf_llava import make_tiny_llava, random_image_bytes

PICTURE = base64.b64encode(random_image_bytes(seed=5)).decode()


@pytest.fixture(scope="module")
def llava(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """(the root URL of a server on a tiny LLaVA, its model name)."""
    path = make_tiny_llava(tmp_path_factory.mktemp("anthropic-llava") / "tiny-llava", seed=3)
    backend = EmbeddedBackend(make_engine(path, block_size=8, num_kv_blocks=256))
    with serving(backend, GatewayOptions(api_key=API_KEY)) as base_url:
        yield base_url.removesuffix("/v1"), backend.model_name


def _asking(source: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"role": "user", "content": [{"type": "text", "text": "What is this?"},
                                         {"type": "image", "source": source}]}]


def test_an_image_block_is_the_image_an_openai_image_part_is(llava: tuple[str, str]) -> None:
    root, model = llava
    client = anthropic.Anthropic(base_url=root, api_key=API_KEY, max_retries=0)
    chat = openai.OpenAI(base_url=f"{root}/v1", api_key=API_KEY, max_retries=0)
    expected = chat.chat.completions.create(model=model, max_tokens=6, temperature=0, messages=[
        {"role": "user", "content": [{"type": "text", "text": "What is this?"},
                                     {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PICTURE}"}}]}])
    for source in ({"type": "base64", "media_type": "image/png", "data": PICTURE},
                   {"type": "url", "url": f"data:image/png;base64,{PICTURE}"}):
        message = client.messages.create(model=model, max_tokens=6, messages=_asking(source), extra_body=greedy())
        assert message.content[0].text == expected.choices[0].message.content
        assert message.usage.input_tokens == expected.usage.prompt_tokens


def test_an_image_url_is_not_fetched(llava: tuple[str, str]) -> None:
    client = anthropic.Anthropic(base_url=llava[0], api_key=API_KEY, max_retries=0)
    with pytest.raises(anthropic.BadRequestError) as raised:
        client.messages.create(model=llava[1], max_tokens=6,
                               messages=_asking({"type": "url", "url": "https://example.com/cat.png"}))
    assert "not fetched" in raised.value.body["error"]["message"]


def test_a_text_model_refuses_images(client: anthropic.Anthropic, model: str) -> None:
    source = {"type": "base64", "media_type": "image/png", "data": PICTURE}
    with pytest.raises(anthropic.BadRequestError) as raised:
        client.messages.create(model=model, max_tokens=6, messages=_asking(source))
    assert "images" in raised.value.body["error"]["message"]


def test_an_image_elsewhere_than_a_user_turn_is_refused(client: anthropic.Anthropic, model: str) -> None:
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PICTURE}}
    with pytest.raises(anthropic.BadRequestError) as raised:
        client.messages.create(model=model, max_tokens=6, messages=[
            {"role": "user", "content": "Hi"}, {"role": "assistant", "content": [image]},
            {"role": "user", "content": "What was that?"}])
    assert "messages[1].content[0].type" in raised.value.body["error"]["message"]
