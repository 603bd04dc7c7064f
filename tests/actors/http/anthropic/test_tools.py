"""Tool use through /v1/messages with the anthropic SDK: tool_choice any and tool always parse (random weights
under the same constraint chat completions use), auto reads a Hermes-style call with the server's parser,
none leaves a call-looking answer as text; the tool_use blocks go back into the conversation with their
tool_result, and the conversation renders as its OpenAI form does. Streamed, a tool_use block opens as
soon as its call's head is read and its input follows as input_json_deltas while it is generated, for
every parser and tool_choice: any cut of the text gives the whole message's blocks."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from actors.http.anthropic.blocks import BlockStep, InputPiece, ReasonedBlocks, ToolStart, content_blocks
from actors.http.tool_parsers import PARSERS
from actors.http.tool_parsers.plan import ToolPlan
from actors.http.tool_parsers.tool_choice import ToolChoice
from tests.actors.http.anthropic.conftest import greedy
from tests.actors.http.anthropic.test_messages import whole_and_streamed
from tests.support.gateway_helpers import API_KEY
from tests.support.tool_texts import REQUIRED, answer_texts, drawn_cuts, one_by_one

WEATHER = {"name": "weather", "description": "The weather in a city now", "input_schema": {
    "type": "object", "properties": {"city": {"type": "string", "enum": ["Oslo", "Lima", "Pune"]}},
    "required": ["city"], "additionalProperties": False}}
CLOCK = {"name": "clock", "input_schema": {
    "type": "object", "properties": {"hours": {"type": "integer", "minimum": 0, "maximum": 23}},
    "required": ["hours"], "additionalProperties": False}}
TOOLS = [WEATHER, CLOCK]
QUESTION = [{"role": "user", "content": "What is the weather in Oslo?"}]
HERMES_CALL = '<tool_call>\n{"name": "weather", "arguments": {"city": "Oslo"}}\n</tool_call>'


def _ask(client: anthropic.Anthropic, model: str, messages: list[Any], **request: Any) -> anthropic.types.Message:
    request = {"tools": TOOLS, "max_tokens": 96, "extra_body": greedy(), **request}
    return whole_and_streamed(client, model=model, messages=messages, **request)


def _valid_input(block: Any) -> bool:
    if block.name == "weather":
        return block.input in ({"city": "Oslo"}, {"city": "Lima"}, {"city": "Pune"})
    return set(block.input) == {"hours"} and 0 <= block.input["hours"] <= 23


def test_any_calls_a_tool_and_its_result_continues_the_conversation(client: anthropic.Anthropic,
                                                                   model: str) -> None:
    called = _ask(client, model, QUESTION, tool_choice={"type": "any"})
    assert called.stop_reason == "tool_use" and called.content
    assert all(block.type == "tool_use" and block.id.startswith("toolu_") and _valid_input(block)
               for block in called.content)
    conversation = [*QUESTION, {"role": "assistant", "content": called.content},  # as the SDK's docs do
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": block.id, "content": "Sunny"}
                                                 for block in called.content]}]
    answer = _ask(client, model, conversation, tool_choice={"type": "none"},
                  extra_body=greedy("It is sunny in Oslo."))
    assert [block.type for block in answer.content] == ["text"] and answer.content[0].text == "It is sunny in Oslo."
    assert answer.stop_reason == "end_turn" and answer.usage.input_tokens > called.usage.input_tokens


def test_a_named_tool_streams_its_input_as_json_deltas(client: anthropic.Anthropic, server: tuple[str, str],
                                                       model: str) -> None:
    called = _ask(client, model, QUESTION, tool_choice={"type": "tool", "name": "clock"})
    assert [(block.type, block.name) for block in called.content] == [("tool_use", "clock")]
    assert _valid_input(called.content[0]) and called.stop_reason == "tool_use"
    body = {"model": model, "messages": QUESTION, "tools": TOOLS, "max_tokens": 96, "stream": True,
            "tool_choice": {"type": "tool", "name": "clock"}, **greedy()}
    events = [json.loads(line.removeprefix("data: ")) for line in httpx.post(
        f"{server[0]}/v1/messages", json=body, headers={"x-api-key": API_KEY}, timeout=60).text.splitlines()
        if line.startswith("data: ")]
    pieces = [event["delta"]["partial_json"] for event in events if event["type"] == "content_block_delta"]
    assert len(pieces) > 1 and json.loads("".join(pieces)) == called.content[0].input  # as the model wrote it


def test_an_input_cut_by_max_tokens_is_the_same_partial_object_streamed_or_not(client: anthropic.Anthropic,
                                                                               model: str) -> None:
    cut = _ask(client, model, QUESTION, tool_choice={"type": "tool", "name": "weather"}, max_tokens=3)
    assert cut.stop_reason == "max_tokens" and cut.usage.output_tokens == 3
    assert [block.name for block in cut.content] == ["weather"] and "city" not in cut.content[0].input


def test_auto_reads_the_model_s_own_call_format_and_keeps_the_text_around_it(client: anthropic.Anthropic,
                                                                             model: str) -> None:
    message = _ask(client, model, QUESTION, extra_body=greedy("Let me check. " + HERMES_CALL))  # auto: the default
    assert [block.type for block in message.content] == ["text", "tool_use"]
    assert message.content[0].text == "Let me check. "
    assert (message.content[1].name, message.content[1].input) == ("weather", {"city": "Oslo"})
    assert message.stop_reason == "tool_use"


def test_none_leaves_a_call_looking_answer_as_text(client: anthropic.Anthropic, model: str) -> None:
    message = _ask(client, model, QUESTION, tool_choice={"type": "none"}, extra_body=greedy(HERMES_CALL))
    assert [block.type for block in message.content] == ["text"] and message.content[0].text == HERMES_CALL
    assert message.stop_reason == "end_turn"


def test_a_tool_conversation_renders_as_its_openai_form(client: anthropic.Anthropic, server: tuple[str, str],
                                                        model: str) -> None:
    """count_tokens of the Anthropic conversation = /tokenize of the same conversation in OpenAI's shape."""
    call = {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Oslo"}}
    conversation = [*QUESTION, {"role": "assistant", "content": [{"type": "text", "text": "Looking."}, call]},
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "Sunny"},
                                                 {"type": "text", "text": "And tomorrow?"}]}]
    counted = client.messages.count_tokens(model=model, system="Be brief.", messages=conversation, tools=TOOLS)
    openai_form = [{"role": "system", "content": "Be brief."}, *QUESTION,
                   {"role": "assistant", "content": "Looking.", "tool_calls": [{"id": "toolu_1", "type": "function",
                    "function": {"name": "weather", "arguments": json.dumps({"city": "Oslo"})}}]},
                   {"role": "tool", "tool_call_id": "toolu_1", "content": "Sunny"},
                   {"role": "user", "content": "And tomorrow?"}]
    openai_tools = [{"type": "function", "function": {"name": tool["name"], "parameters": tool["input_schema"],
                                                      **({"description": tool["description"]} if "description" in tool
                                                         else {})}} for tool in TOOLS]
    tokenized = httpx.post(f"{server[0]}/tokenize", headers={"Authorization": f"Bearer {API_KEY}"},
                           json={"messages": openai_form, "tools": openai_tools}).json()
    assert counted.input_tokens == tokenized["count"]


def _blocks(plan: ToolPlan, pieces: list[str]) -> tuple[list[dict[str, Any]], list[str]]:
    """(the message's content without tool ids, each tool_use block's input JSON as it streamed)."""
    blocks = ReasonedBlocks(plan, None)
    steps: list[BlockStep] = [*(step for piece in pieces for step in blocks.feed(piece)), *blocks.finish()]
    inputs: list[str] = []
    for step in steps:
        if isinstance(step, ToolStart):
            inputs.append("")
        elif isinstance(step, InputPiece):
            inputs[-1] += step.partial_json
    content = content_blocks(steps)
    for block in content:
        block.pop("id", None)
    return content, inputs


@pytest.mark.parametrize("parser", sorted(PARSERS))
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_any_cut_of_an_answer_gives_the_whole_message_s_blocks(parser: str, data: st.DataObject) -> None:
    text = data.draw(answer_texts(parser))
    plan = ToolPlan(ToolChoice("auto"), parser)
    whole = _blocks(plan, [text])
    assert _blocks(plan, drawn_cuts(data, text)) == whole
    assert _blocks(plan, one_by_one(text)) == whole
    calls = plan.calls(text).calls
    assert whole[1] == [call.arguments for call in calls]  # the input deltas add up to chat's arguments


def test_any_streams_each_input_piece_by_piece() -> None:
    content, inputs = _blocks(ToolPlan(ToolChoice("required"), None), one_by_one(REQUIRED))
    assert [(block["name"], block["input"]) for block in content] == [("weather", {"city": "Oslo"}),
                                                                      ("clock", {"hours": 7})]
    steps = ReasonedBlocks(ToolPlan(ToolChoice("required"), None), None)
    pieces = [step for char in REQUIRED for step in steps.feed(char) if isinstance(step, InputPiece)]
    assert len(pieces) > 10 and "".join(piece.partial_json for piece in pieces) == "".join(inputs)


def test_auto_streams_a_call_s_input_as_it_is_generated(client: anthropic.Anthropic, server: tuple[str, str],
                                                        model: str) -> None:
    text = "Let me check. " + HERMES_CALL
    message = _ask(client, model, QUESTION, extra_body=greedy(text))
    body = {"model": model, "messages": QUESTION, "tools": TOOLS, "max_tokens": 96, "stream": True, **greedy(text)}
    events = [json.loads(line.removeprefix("data: ")) for line in httpx.post(
        f"{server[0]}/v1/messages", json=body, headers={"x-api-key": API_KEY}, timeout=60).text.splitlines()
        if line.startswith("data: ")]
    started = [event["content_block"] for event in events if event["type"] == "content_block_start"]
    assert [block["type"] for block in started] == ["text", "tool_use"]
    assert started[1]["name"] == "weather" and started[1]["input"] == {}
    pieces = [event["delta"]["partial_json"] for event in events
              if event["type"] == "content_block_delta" and event["index"] == 1]
    assert len(pieces) > 1 and "".join(pieces) == '{"city": "Oslo"}'  # as the model wrote it
    assert json.loads("".join(pieces)) == message.content[1].input
