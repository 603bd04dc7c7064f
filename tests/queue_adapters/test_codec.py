"""Wire protocol v1: round trips, and every request rule rejected with a message naming the field."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.request.sampling_params import SamplingParams
from queue_adapters.codec import (
    ChatMessage,
    CodecError,
    Malformed,
    WireCancel,
    WireChoice,
    WireError,
    WireReply,
    WireRequest,
    WireUsage,
    decode_cancel,
    decode_reply,
    decode_request,
    encode,
    peek_ids,
)


def reject(request: Any) -> CodecError:
    raw = request if isinstance(request, bytes) else msgspec.msgpack.encode(request)
    with pytest.raises(CodecError) as caught:
        decode_request(raw)
    return caught.value


def test_request_round_trips_each_prompt_kind() -> None:
    requests = [
        WireRequest(id="r-1", prompt="hello", params={"max_tokens": 5, "temperature": 0.0, "stop": ["\n"]},
                    lora="sql", reply_to="custom:out", deadline_ms=1_700_000_000_000),
        WireRequest(id="r.2:x_y", prompt_token_ids=[0, 1, 2]),
        WireRequest(id="r3", messages=[ChatMessage(role="user", content="hi")], params={"n": 2}),
    ]
    for request in requests:
        assert decode_request(encode(request)) == request


def test_request_encoding_omits_unset_keys() -> None:
    assert msgspec.msgpack.decode(encode(WireRequest(id="a", prompt="x"))) == {"id": "a", "prompt": "x"}


def test_plain_map_decodes_like_the_struct() -> None:
    request = decode_request(encode({"id": "a", "prompt": "x", "params": {"seed": 3}}))
    assert request.sampling_params().seed == 3


def test_params_checked_skips_only_the_params_check() -> None:
    # The gateway validated params with SamplingParams already; the shape and prompt are still checked.
    raw = encode({"id": "a", "prompt": "x", "params": {"temperature": -1.0}})
    assert decode_request(raw, params_checked=True).params == {"temperature": -1.0}
    with pytest.raises(CodecError, match="temperature"):
        decode_request(raw)
    with pytest.raises(CodecError, match="prompt"):
        decode_request(encode({"id": "a", "prompt": ""}), params_checked=True)
    with pytest.raises(CodecError):
        decode_request(encode({"id": "a b", "prompt": "x"}), params_checked=True)


def test_reply_and_cancel_round_trip() -> None:
    reply = WireReply(id="a", seq=3, choices=[
        WireChoice(index=0, token_ids=[5, 6], text="hi", logprobs=[{"5": -0.1}], finish_reason="stop",
                   stop_reason="\n"),
        WireChoice(index=1, token_ids=[7], text="x", stop_reason=None)],
        usage=WireUsage(prompt_tokens=4, completion_tokens=3, cached_tokens=2))
    assert decode_reply(encode(reply)) == reply
    failed = WireReply(id="a", seq=0, error=WireError(code="bad_request", message="nope"))
    assert decode_reply(encode(failed)).is_error
    assert decode_cancel(encode(WireCancel(cancel="a"))) == WireCancel(cancel="a")


@pytest.mark.parametrize(("request_map", "expected"), [
    ({"id": "a", "prompt": "x", "temperature": 1}, "temperature is not a known field"),
    ({"id": "a", "prompt": "x", "params": {"temprature": 1}}, "params.temprature"),
    ({"id": "a", "prompt": "x", "params": {"max_tokens": -1}}, "params.max_tokens must be >= 0, got -1"),
    ({"id": "a", "prompt": "x", "params": {"top_p": "high"}}, "params.top_p must be a number"),
    ({"id": "a", "prompt": "x", "params": []}, "params must be a map, got a list"),
    ({"id": 7, "prompt": "x"}, "id must be a string, got an int"),
    ({"id": "a", "prompt": 5}, "prompt must be a string or nil, got an int"),
    ({"id": "a", "prompt_token_ids": ["1"]}, "prompt_token_ids[0] must be an int, got a string"),
    ({"id": "a", "prompt_token_ids": [1, 2, 3, -4]}, "prompt_token_ids[3] must be >= 0"),
    ({"id": "a", "prompt": "x", "deadline_ms": "soon"}, "deadline_ms must be an int or nil, got a string"),
    ({"id": "a", "prompt": "x", "lora": 3}, "lora must be a string or nil, got an int"),
    ({"id": "a", "prompt": ""}, "prompt must not be empty"),
    ({"id": "a", "prompt_token_ids": []}, "prompt_token_ids must not be empty"),
    ({"id": "a", "messages": []}, "messages must not be empty"),
    ({"id": "a"}, "exactly one of prompt, prompt_token_ids, messages is required, got none"),
    ({"id": "a", "prompt": "x", "prompt_token_ids": [1]}, "got prompt, prompt_token_ids"),
    ({"id": "a", "messages": [{"role": "user"}]}, "messages[0].content is required"),
    ({"id": "a", "messages": [{"role": "user", "content": "c", "tool_call_id": "n"}]},
     "messages[0].tool_call_id is only for tool messages"),
    ({"id": "a", "messages": [{"role": "user", "content": "c", "function_call": {}}]},
     "messages[0].function_call is not a known"),
    ({"id": "a", "messages": [{"role": "assistant", "content": "", "tool_calls": [
        {"id": "c", "function": {"name": "f", "arguments": "[1]"}}]}]},
     "messages[0].tool_calls[0].function.arguments must be the text of a JSON object"),
    ({"id": "a", "messages": [{"role": "user", "content": "c"}], "tools": [{"type": "function"}]},
     "tools[0] must be"),
    ({"id": "a", "prompt": "x", "tools": [{"type": "function", "function": {"name": "f"}}]},
     "tools need messages"),
    ({"id": "a", "messages": [{"role": "user", "content": "c", "name": ""}]}, "messages[0].name"),
    ({"prompt": "x"}, "id is required"),
    ({"id": "", "prompt": "x"}, "id must have length >= 1"),
    ({"id": "a b", "prompt": "x"}, "id must match"),
    ({"id": "a/b", "prompt": "x"}, "id must match"),
    ({"id": "a" * 161, "prompt": "x"}, "id must have length <= 160"),
    ({"id": "a", "prompt": "x", "reply_to": ""}, "reply_to must have length >= 1"),
    ({1: "a"}, "request keys must be a string, got an int"),
    (["id", "a"], "request must be a map, got a list"),
    (3, "request must be a map, got an int"),
])
def test_each_request_rule_is_rejected_with_the_field_named(request_map: Any, expected: str) -> None:
    assert expected in str(reject(request_map))


def test_bytes_that_are_not_msgpack_are_rejected() -> None:
    assert "not valid msgpack" in str(reject(b"\xc1"))
    assert "not valid msgpack" in str(reject(b""))


def test_bad_finish_reason_names_the_choice_and_the_allowed_values() -> None:
    bad = {"id": "a", "seq": 0, "choices": [{"index": 0, "finish_reason": "done"}]}
    with pytest.raises(CodecError, match=r"choices\[0\].finish_reason must be one of stop, length, abort, timeout"):
        decode_reply(msgspec.msgpack.encode(bad))


def test_reply_with_unknown_key_or_negative_seq_is_rejected() -> None:
    with pytest.raises(CodecError, match="extra is not a known field"):
        decode_reply(msgspec.msgpack.encode({"id": "a", "seq": 0, "extra": 1}))
    with pytest.raises(CodecError, match="seq must be >= 0"):
        decode_reply(msgspec.msgpack.encode({"id": "a", "seq": -1}))


def test_errors_carry_the_id_and_reply_to_when_readable() -> None:
    error = reject({"id": "req-9", "reply_to": "mine", "prompt": "x", "params": {"n": 0}})
    assert (error.request_id, error.reply_to) == ("req-9", "mine")
    error = reject({"id": "req-9", "reply_to": "mine", "bogus": True})
    assert (error.request_id, error.reply_to) == ("req-9", "mine")
    assert reject({"id": "bad id", "prompt": "x"}).request_id is None
    assert reject(b"\xc1").request_id is None


def test_peek_ids_ignores_invalid_values() -> None:
    assert peek_ids(msgspec.msgpack.encode({"id": "ok", "reply_to": 5})) == ("ok", None)
    assert peek_ids(msgspec.msgpack.encode({"id": ["x"], "reply_to": "r"})) == (None, None)
    assert peek_ids(msgspec.msgpack.encode([1, 2])) == (None, None)


def test_malformed_marker_keeps_what_the_error_knew() -> None:
    error = CodecError("prompt must not be empty", "a", "out")
    assert Malformed.from_error(b"raw", error, "1-0") == Malformed(b"raw", "prompt must not be empty", "1-0", "a",
                                                                    "out")
    assert Malformed.from_error(None, KeyError("x"), "1-0").error == "KeyError: 'x'"


# --- fuzzing: decode_request returns a valid request or raises CodecError, nothing else ---------

_scalars = st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | st.text(max_size=8) | st.binary(
    max_size=8)
_values = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
    st.text(max_size=6) | st.integers(-3, 3), inner, max_size=4), max_leaves=10)
_request_keys = st.sampled_from(["id", "prompt", "prompt_token_ids", "messages", "params", "lora", "reply_to",
                                 "deadline_ms"]) | st.text(max_size=6)
_param_keys = st.sampled_from(sorted(SamplingParams.__dataclass_fields__)) | st.text(max_size=6)
_params = st.dictionaries(_param_keys, _values, max_size=4)
_request_like = st.dictionaries(_request_keys, _values | _params, max_size=6) | st.fixed_dictionaries(
    {"id": st.text(max_size=8), "prompt": st.text(max_size=4)}, optional={"params": _params,
                                                                          "prompt_token_ids": _values})


def _must_be_valid_or_codec_error(raw: bytes) -> None:
    try:
        request = decode_request(raw)
    except CodecError as error:
        assert str(error)
        return
    assert isinstance(request, WireRequest)
    assert sum(value is not None for value in (request.prompt, request.prompt_token_ids, request.messages)) == 1
    request.sampling_params()


@settings(max_examples=400, deadline=None)
@given(_request_like)
def test_fuzzed_maps_decode_or_raise_codec_error(request_map: dict[Any, Any]) -> None:
    _must_be_valid_or_codec_error(msgspec.msgpack.encode(request_map))


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=64))
def test_fuzzed_bytes_decode_or_raise_codec_error(raw: bytes) -> None:
    _must_be_valid_or_codec_error(raw)
