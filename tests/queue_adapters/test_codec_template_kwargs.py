"""The wire's `chat_template_kwargs`: they round-trip with chat messages, and a worker refuses, with
an error naming the rule (and the id read, so the client gets an answer), what the gateway would."""

from __future__ import annotations

import msgspec
import pytest

from queue_adapters.codec import ChatMessage, CodecError, WireRequest, decode_request, encode

MESSAGES = [ChatMessage(role="user", content="Hi")]


def test_template_variables_round_trip_with_messages() -> None:
    request = WireRequest(id="r", messages=MESSAGES,
                          chat_template_kwargs={"enable_thinking": False, "effort": {"level": [1, 2.5, None]}})
    assert decode_request(encode(request)) == request
    assert "chat_template_kwargs" not in msgspec.msgpack.decode(encode(WireRequest(id="r", messages=MESSAGES)))


@pytest.mark.parametrize(("fields", "says"), [
    ({"prompt": "Hi", "chat_template_kwargs": {"x": 1}}, "chat_template_kwargs need messages"),
    ({"chat_template_kwargs": {"tools": []}}, "chat_template_kwargs.tools is reserved"),
    ({"chat_template_kwargs": {"x": b"\x00"}}, "JSON values only"),
    ({"chat_template_kwargs": {"x": 2**63 + 5}}, "64-bit signed range"),
    ({"chat_template_kwargs": [1]}, "chat_template_kwargs"),
])
def test_a_worker_refuses_what_the_gateway_would(fields: dict, says: str) -> None:
    raw = {"id": "r-7", "messages": [{"role": "user", "content": "Hi"}], **fields}
    if "prompt" in fields:
        del raw["messages"]
    with pytest.raises(CodecError, match=says) as caught:
        decode_request(msgspec.msgpack.encode(raw))
    assert caught.value.request_id == "r-7"
