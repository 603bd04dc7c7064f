"""`--reasoning-parser gpt_oss` (and `--tool-call-parser openai`) through the chat completions route, a
scripted backend standing in for the workers: the request asks for the special tokens (harmony's
markers), the answer's analysis channel becomes `reasoning` and its final channel `content`, streamed
deltas add up to the non-streamed message however the text is cut, and a call to a function becomes
`tool_calls`; Anthropic's messages and the Responses API split alike; `serve` takes the flags."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from actors.http.app import create_app
from actors.http.options import GatewayOptions
from actors.http.reasoning import FORMATS
from actors.http.tool_parsers.plan import ToolPlan
from actors.http.tool_parsers.tool_choice import ToolChoice
from queue_adapters.codec import WireChoice, WireReply, WireRequest, WireUsage
from tests.actors.http.openai.test_reasoning_streaming import whole_and_streamed
from tests.support.gateway_helpers import SilentBackend
from tests.support.tool_texts import add_call_deltas

CHAT = {"model": "silent", "messages": [{"role": "user", "content": "Weather in Oslo?"}], "max_tokens": 64}
WEATHER = {"type": "function", "function": {"name": "weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
NEXT = "<|end|><|start|>assistant"
ANSWER = ["<|chan", "nel|>analysis<|mess", "age|>Look it", " up.<|e", "nd|><|start|>assistant<|channel|>fin",
          "al<|message|>It is", " sunny.<|return|>"]
CALLING = ["<|channel|>analysis<|message|>Need the weather.", f"{NEXT}<|channel|>commentary to=functions.wea",
           'ther <|constrain|>json<|message|>{"city":', ' "Oslo"}']  # <|call|> is a stop token: not in the text
CALL = '<|channel|>commentary to=functions.weather <|constrain|>json<|message|>{"city": "Oslo"}'
TEXTS = [f"<|channel|>analysis<|message|>Add them.{NEXT}<|channel|>final<|message|>It is 4.<|return|>",
         "<|channel|>analysis<|message|>cut short", "No harmony here.", "", "<|chan", "<|channel|>final<|message|>4",
         f"<|channel|>analysis<|message|>a{NEXT}<|channel|>analysis<|message|>b{NEXT}<|channel|>final<|message|>c"]


class ScriptedBackend(SilentBackend):
    """Answers every request with `answer`, one reply entry per piece; keeps what it got."""

    def __init__(self, answer: list[str]) -> None:
        super().__init__()
        self.answer = answer
        self.submitted: list[WireRequest] = []

    async def submit(self, request: WireRequest) -> None:
        self.submitted.append(request)

    async def replies(self, request: WireRequest) -> AsyncIterator[WireReply]:
        for seq, text in enumerate(self.answer):
            last = seq == len(self.answer) - 1
            yield WireReply(id=request.id, seq=seq, choices=[WireChoice(
                index=0, token_ids=[seq], text=text, finish_reason="stop" if last else None)],
                usage=WireUsage(prompt_tokens=4, completion_tokens=len(self.answer)) if last else None,
                prompt_tokens=4 if seq == 0 else None)


def _client(backend: SilentBackend, **options) -> httpx.AsyncClient:
    app = create_app(backend, GatewayOptions(**options))
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app, raise_app_exceptions=False),
                             base_url="http://gateway")


def _streamed(response: httpx.Response) -> dict:
    message: dict = {"reasoning": None, "reasoning_content": None, "content": None}
    calls: dict[int, list[str]] = {}
    for line in response.text.splitlines():
        if not line.startswith("data: {"):
            continue
        for choice in json.loads(line.removeprefix("data: "))["choices"]:
            for key in ("reasoning", "reasoning_content", "content"):
                if choice["delta"].get(key):
                    message[key] = (message[key] or "") + choice["delta"][key]
            add_call_deltas(calls, choice["delta"].get("tool_calls", []))
    return {**message, "tool_calls": [(name, json.loads(arguments)) for name, arguments in calls.values()]}


async def test_the_analysis_channel_is_the_reasoning_and_the_final_one_the_content() -> None:
    backend = ScriptedBackend(ANSWER)
    async with _client(backend, reasoning_parser="gpt_oss") as client:
        whole = (await client.post("/v1/chat/completions", json=CHAT)).json()["choices"][0]["message"]
        streamed = _streamed(await client.post("/v1/chat/completions", json={**CHAT, "stream": True}))
    assert whole == {"role": "assistant", "content": "It is sunny.", "reasoning": "Look it up.",
                     "reasoning_content": "Look it up."}
    assert streamed == {"reasoning": "Look it up.", "reasoning_content": "Look it up.", "content": "It is sunny.",
                        "tool_calls": []}
    for request in backend.submitted:  # harmony's markers are special tokens: asked for in the text
        assert request.params["skip_special_tokens"] is False


async def test_messages_and_responses_split_the_same_and_ask_for_the_markers_too() -> None:
    backend = ScriptedBackend(ANSWER)
    async with _client(backend, reasoning_parser="gpt_oss") as client:
        messages = await client.post("/v1/messages", json={**CHAT, "model": "silent"})
        responses = await client.post("/v1/responses", json={"model": "silent", "input": "Weather in Oslo?"})
    assert messages.status_code == responses.status_code == 200, (messages.text, responses.text)
    assert [(block["type"], block.get("thinking", block.get("text"))) for block in messages.json()["content"]] == [
        ("thinking", "Look it up."), ("text", "It is sunny.")]
    output = responses.json()["output"]
    assert [item["type"] for item in output] == ["reasoning", "message"]
    assert output[0]["content"][0]["text"] == "Look it up." and output[1]["content"][0]["text"] == "It is sunny."
    assert [request.params["skip_special_tokens"] for request in backend.submitted] == [False, False]


async def test_other_parsers_leave_the_special_tokens_to_the_client() -> None:
    backend = ScriptedBackend(ANSWER)
    async with _client(backend, reasoning_parser="qwen3") as client:
        await client.post("/v1/chat/completions", json={**CHAT, "skip_special_tokens": True})
        await client.post("/v1/chat/completions", json=CHAT)
    assert backend.submitted[0].params["skip_special_tokens"] is True
    assert "skip_special_tokens" not in backend.submitted[1].params


async def test_a_call_to_a_function_becomes_tool_calls_streamed_and_not() -> None:
    options = {"reasoning_parser": "gpt_oss", "tool_call_parser": "openai"}
    async with _client(ScriptedBackend(CALLING), **options) as client:
        body = {**CHAT, "tools": [WEATHER]}
        whole = (await client.post("/v1/chat/completions", json=body)).json()["choices"][0]
        streamed = _streamed(await client.post("/v1/chat/completions", json={**body, "stream": True}))
    message = whole["message"]
    assert message["reasoning"] == "Need the weather." and message["content"] is None
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message["tool_calls"]] == [
        ("weather", {"city": "Oslo"})]
    assert whole["finish_reason"] == "tool_calls"
    assert streamed["reasoning"] == "Need the weather." and streamed["content"] is None
    assert streamed["tool_calls"] == [("weather", {"city": "Oslo"})]


@pytest.mark.parametrize("text", TEXTS)
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_any_cut_streams_the_non_streamed_message(text: str, data: st.DataObject) -> None:
    cuts = sorted(set(data.draw(st.lists(st.integers(1, max(len(text) - 1, 1)), max_size=10))))
    whole, streamed = whole_and_streamed(FORMATS["gpt_oss"], text, [cut for cut in cuts if cut < len(text)])
    assert streamed == whole


@pytest.mark.parametrize("cuts", [[], [4], [10, 30], list(range(1, 200, 7))])
def test_calls_are_read_from_the_content_only(cuts: list[int]) -> None:
    auto = ToolPlan(ToolChoice("auto"), "openai")
    thought = 'I could call to=functions.weather json {"city": "Oslo"} here.'
    text = (f"<|channel|>analysis<|message|>{thought}{NEXT}<|channel|>commentary<|message|>"
            f"Checking.{NEXT}{CALL}<|call|>")
    whole, streamed = whole_and_streamed(FORMATS["gpt_oss"], text, [c for c in cuts if c < len(text)], auto)
    assert whole == streamed
    assert whole["reasoning"] == thought  # a call's words inside the reasoning make no call
    assert whole["content"] == "Checking." and whole["calls"] == [("weather", {"city": "Oslo"})]
    assert whole["finish_reason"] == "tool_calls"


def test_serve_takes_gpt_oss_and_openai_goes_with_it() -> None:
    from actors.cli.main import build_parser
    from actors.http.serve_args import options_from_args

    parser = build_parser()
    options = options_from_args(parser.parse_args(["serve", "--reasoning-parser", "gpt_oss"]))
    assert options.reasoning_parser == "gpt_oss"
    both = options_from_args(parser.parse_args([
        "serve", "--reasoning-parser", "gpt_oss", "--enable-auto-tool-choice", "--tool-call-parser", "openai"]))
    assert both.tool_call_parser == "openai"
    with pytest.raises(ValueError, match="requires --reasoning-parser gpt_oss"):
        options_from_args(parser.parse_args(["serve", "--enable-auto-tool-choice", "--tool-call-parser", "openai"]))
