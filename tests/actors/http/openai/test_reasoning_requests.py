"""Reasoning requests at the gateway's edge (a scripted backend stands in for the workers): the chat
template's variables (`chat_template_kwargs`, `reasoning_effort`, `--default-chat-template-kwargs`)
go on the wire merged, names the template owns are 400s, and `--reasoning-parser` splits the answer,
per request (qwen3 with thinking off: all content)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import httpx
import pytest

from actors.http.app import create_app
from actors.http.options import GatewayOptions
from queue_adapters.codec import WireChoice, WireReply, WireRequest, WireUsage
from tests.support.gateway_helpers import SilentBackend

CHAT = {"model": "silent", "messages": [{"role": "user", "content": "2 + 2?"}], "max_tokens": 8}
ANSWER = ["<thi", "nk>Add", " them.</th", "ink>\n\n4"]


class ScriptedBackend(SilentBackend):
    """Answers every request with ANSWER, one reply entry per piece; keeps what it got."""

    def __init__(self) -> None:
        super().__init__()
        self.submitted: list[WireRequest] = []

    async def submit(self, request: WireRequest) -> None:
        self.submitted.append(request)

    async def replies(self, request: WireRequest) -> AsyncIterator[WireReply]:
        for seq, text in enumerate(ANSWER):
            last = seq == len(ANSWER) - 1
            yield WireReply(id=request.id, seq=seq, choices=[WireChoice(
                index=0, token_ids=[seq], text=text, finish_reason="stop" if last else None)],
                usage=WireUsage(prompt_tokens=4, completion_tokens=len(ANSWER)) if last else None,
                prompt_tokens=4 if seq == 0 else None)


def _client(backend: SilentBackend, **options) -> httpx.AsyncClient:
    app = create_app(backend, GatewayOptions(**options))
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app, raise_app_exceptions=False),
                             base_url="http://gateway")


def _streamed_message(response: httpx.Response) -> dict:
    message: dict = {"reasoning": None, "reasoning_content": None, "content": None}
    for line in response.text.splitlines():
        if line.startswith("data: {"):
            for choice in json.loads(line.removeprefix("data: "))["choices"]:
                for key in message:
                    if choice["delta"].get(key):
                        message[key] = (message[key] or "") + choice["delta"][key]
    return message


async def test_template_variables_travel_on_the_wire_over_the_defaults() -> None:
    backend = ScriptedBackend()
    defaults = {"enable_thinking": False, "persona": "terse"}
    async with _client(backend, default_chat_template_kwargs=defaults) as client:
        plain = await client.post("/v1/chat/completions", json=CHAT)
        asked = await client.post("/v1/chat/completions", json={
            **CHAT, "reasoning_effort": "high", "chat_template_kwargs": {"enable_thinking": True, "depth": [1, 2]}})
    assert plain.status_code == asked.status_code == 200, asked.text
    assert backend.submitted[0].chat_template_kwargs == defaults
    assert backend.submitted[1].chat_template_kwargs == {"enable_thinking": True, "persona": "terse",
                                                         "reasoning_effort": "high", "depth": [1, 2]}


async def test_no_template_variables_send_none() -> None:
    backend = ScriptedBackend()
    async with _client(backend) as client:
        response = await client.post("/v1/chat/completions", json={**CHAT, "chat_template_kwargs": {}})
    assert response.status_code == 200 and backend.submitted[0].chat_template_kwargs is None


@pytest.mark.parametrize(("field", "value", "says"), [
    ("chat_template_kwargs", {"messages": []}, "reserved"),
    ("chat_template_kwargs", {"add_generation_prompt": False}, "reserved"),
    ("chat_template_kwargs", {"tokenize": True}, "reserved"),
    ("chat_template_kwargs", {"eos_token": "<|im_start|>"}, "reserved"),
    ("chat_template_kwargs", {"not a name": 1}, "template variable name"),
    ("chat_template_kwargs", ["enable_thinking"], "must be an object"),
    ("chat_template_kwargs", {f"v{i}": i for i in range(65)}, "at most 64"),
    ("reasoning_effort", "extreme", "low, medium, high"),
])
async def test_bad_template_variables_are_400s_naming_the_field(field: str, value: object, says: str) -> None:
    backend = ScriptedBackend()
    async with _client(backend) as client:
        response = await client.post("/v1/chat/completions", json={**CHAT, field: value})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == field and says in response.json()["error"]["message"]
    assert backend.submitted == []


async def test_a_completion_has_no_chat_template_to_take_variables() -> None:
    async with _client(ScriptedBackend()) as client:
        for field, value in (("chat_template_kwargs", {"enable_thinking": False}), ("reasoning_effort", "low")):
            response = await client.post("/v1/completions", json={"model": "silent", "prompt": "Hi", field: value})
            assert response.status_code == 400 and response.json()["error"]["param"] == field


async def test_the_reasoning_parser_splits_the_answer_streamed_and_not() -> None:
    async with _client(ScriptedBackend(), reasoning_parser="qwen3") as client:
        whole = (await client.post("/v1/chat/completions", json=CHAT)).json()["choices"][0]["message"]
        streamed = _streamed_message(await client.post("/v1/chat/completions", json={**CHAT, "stream": True}))
        off = {**CHAT, "chat_template_kwargs": {"enable_thinking": False}}
        whole_off = (await client.post("/v1/chat/completions", json=off)).json()["choices"][0]["message"]
        streamed_off = _streamed_message(await client.post("/v1/chat/completions", json={**off, "stream": True}))
    assert whole == {"role": "assistant", "content": "\n\n4", "reasoning": "Add them.",
                     "reasoning_content": "Add them."}
    assert streamed == {"reasoning": "Add them.", "reasoning_content": "Add them.", "content": "\n\n4"}
    assert whole_off == {"role": "assistant", "content": "".join(ANSWER), "reasoning": None,
                         "reasoning_content": None}
    assert streamed_off == {"reasoning": None, "reasoning_content": None, "content": "".join(ANSWER)}


async def test_thinking_off_by_default_can_be_switched_on_per_request() -> None:
    options = {"reasoning_parser": "qwen3", "default_chat_template_kwargs": {"enable_thinking": False}}
    async with _client(ScriptedBackend(), **options) as client:
        off = (await client.post("/v1/chat/completions", json=CHAT)).json()["choices"][0]["message"]
        on = (await client.post("/v1/chat/completions", json={
            **CHAT, "chat_template_kwargs": {"enable_thinking": True}})).json()["choices"][0]["message"]
    assert off["reasoning"] is None and off["content"] == "".join(ANSWER)
    assert on["reasoning"] == "Add them." and on["content"] == "\n\n4"


def test_serve_takes_the_reasoning_flags() -> None:
    from actors.cli.main import build_parser
    from actors.http.serve_args import options_from_args

    parser = build_parser()
    options = options_from_args(parser.parse_args([
        "serve", "--reasoning-parser", "deepseek_r1", "--default-chat-template-kwargs", '{"enable_thinking": false}']))
    assert options.reasoning_parser == "deepseek_r1"
    assert options.default_chat_template_kwargs == {"enable_thinking": False}
    assert options_from_args(parser.parse_args(["serve"])).reasoning_parser is None
    for bad, says in (("[1]", "must be an object"), ('{"tools": []}', "reserved"), ("{", "not valid JSON")):
        with pytest.raises(ValueError, match=says):
            options_from_args(parser.parse_args(["serve", "--default-chat-template-kwargs", bad]))
    with pytest.raises(SystemExit):  # argparse: not one of the parsers
        parser.parse_args(["serve", "--reasoning-parser", "granite"])
