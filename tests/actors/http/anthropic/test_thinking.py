"""`thinking` on a server with --reasoning-parser: the answer's reasoning is a first thinking block, then
its text, streamed (thinking_delta, an empty signature_delta) as whole; `enable_thinking` reaches the
chat template; without a parser, or with a budget outside Anthropic's rules, `thinking` enabled is a 400.
The model's text is forced with a regex constraint (random weights write no `<think>` by themselves)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest

from actors.http.backends import EmbeddedBackend
from actors.http.options import GatewayOptions
from tests.actors.http.anthropic.conftest import greedy
from tests.actors.http.anthropic.test_messages import HELLO, whole_and_streamed
from tests.support.engine_helpers import make_engine
from tests.support.gateway_helpers import API_KEY, serving
from tests.support.reasoning_templates import THINKING

ANSWER = "<think>plan</think>Answer"
ENABLED = {"type": "enabled", "budget_tokens": 1024}


@pytest.fixture(scope="module")
def thinking_server(default_model_path: Path) -> Iterator[str]:
    """The root URL of a server with --reasoning-parser think and a Qwen3-style thinking template."""
    backend = EmbeddedBackend(make_engine(default_model_path, chat_template=THINKING, num_kv_blocks=256))
    with serving(backend, GatewayOptions(api_key=API_KEY, reasoning_parser="think")) as base_url:
        yield base_url.removesuffix("/v1")


@pytest.fixture(scope="module")
def thinker(thinking_server: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=thinking_server, api_key=API_KEY, max_retries=0)


def test_the_reasoning_is_a_thinking_block_before_the_text_streamed_or_not(thinker: anthropic.Anthropic,
                                                                          model: str) -> None:
    message = whole_and_streamed(thinker, model=model, max_tokens=1100, messages=HELLO, thinking=ENABLED,
                                 extra_body=greedy(ANSWER))
    assert [block.model_dump() for block in message.content] == [
        {"type": "thinking", "thinking": "plan", "signature": ""},
        {"type": "text", "text": "Answer", "citations": None}]
    assert message.stop_reason == "end_turn"


def test_the_thinking_block_streams_as_thinking_deltas_then_an_empty_signature(thinking_server: str,
                                                                              model: str) -> None:
    body = {"model": model, "max_tokens": 1100, "messages": HELLO, "stream": True, "thinking": ENABLED,
            **greedy(ANSWER)}
    response = httpx.post(f"{thinking_server}/v1/messages", json=body, headers={"x-api-key": API_KEY}, timeout=60)
    events = [json.loads(text.split("\ndata: ", 1)[1]) for text in response.text.strip().split("\n\n")]
    blocks = [event for event in events if event["type"].startswith("content_block")]
    assert blocks[0] == {"type": "content_block_start", "index": 0,
                         "content_block": {"type": "thinking", "thinking": "", "signature": ""}}
    deltas = [event["delta"] for event in blocks if event["index"] == 0 and event["type"] == "content_block_delta"]
    assert "".join(delta.get("thinking", "") for delta in deltas) == "plan"
    assert {delta["type"] for delta in deltas[:-1]} == {"thinking_delta"}
    assert deltas[-1] == {"type": "signature_delta", "signature": ""}
    assert [event["type"] for event in blocks if event["index"] == 0][-1] == "content_block_stop"
    assert blocks[-1] == {"type": "content_block_stop", "index": 1}


def test_thinking_switches_the_template_s_enable_thinking(thinker: anthropic.Anthropic, model: str) -> None:
    def input_tokens(**thinking: Any) -> int:
        return thinker.messages.create(model=model, max_tokens=1100, messages=HELLO, extra_body=greedy("A"),
                                       **thinking).usage.input_tokens
    # The template closes an empty think block in the prompt when thinking is off.
    assert input_tokens(thinking={"type": "disabled"}) > input_tokens(thinking=ENABLED) == input_tokens()
    counted = thinker.messages.count_tokens(model=model, messages=HELLO, thinking={"type": "disabled"})
    assert counted.input_tokens == input_tokens(thinking={"type": "disabled"})


def test_an_answer_that_does_not_reason_is_text_only(thinker: anthropic.Anthropic, model: str) -> None:
    message = whole_and_streamed(thinker, model=model, max_tokens=1100, messages=HELLO, thinking=ENABLED,
                                 extra_body=greedy("Answer"))
    assert [block.type for block in message.content] == ["text"] and message.content[0].text == "Answer"


@pytest.mark.parametrize("thinking, named", [
    ({"type": "enabled", "budget_tokens": 1023}, ">= 1024"),
    ({"type": "enabled", "budget_tokens": 1100}, "less than max_tokens"),
    ({"type": "enabled"}, "budget_tokens"),
    ({"type": "sometimes"}, "thinking must be")])
def test_a_budget_outside_anthropic_s_rules_is_a_400(thinker: anthropic.Anthropic, model: str,
                                                     thinking: dict[str, Any], named: str) -> None:
    with pytest.raises(anthropic.BadRequestError, match=re.escape(named)):
        thinker.messages.create(model=model, max_tokens=1100, messages=HELLO, extra_body={"thinking": thinking})


def test_thinking_enabled_without_a_reasoning_parser_is_a_400(client: anthropic.Anthropic, model: str) -> None:
    with pytest.raises(anthropic.BadRequestError, match="--reasoning-parser"):
        client.messages.create(model=model, max_tokens=1100, messages=HELLO, thinking=ENABLED)
    # Disabled asks for nothing: the same answer as without the field.
    plain = client.messages.create(model=model, max_tokens=4, messages=HELLO, extra_body=greedy("Hi"))
    off = client.messages.create(model=model, max_tokens=4, messages=HELLO, thinking={"type": "disabled"},
                                 extra_body=greedy("Hi"))
    assert off.content == plain.content and off.usage == plain.usage
