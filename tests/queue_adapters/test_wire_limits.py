"""Size limits read from msgpack headers before a request entry is decoded: each refusal names the
field and where its limit comes from, an entry is refused at the header that is over the limit
(whatever follows it), and what is within the limits decodes exactly as without them."""

from __future__ import annotations

import time

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from queue_adapters.codec import CodecError, decode_request
from queue_adapters.wire_limits import MAX_NESTED_ITEMS, WireLimits

LIMITS = WireLimits.of(max_prompt_chars=1000, max_image_bytes=4096, max_stop_strings=8, max_logit_bias=16,
                       max_token_bans=32)


def _raw(**fields: object) -> bytes:
    return msgpack.packb({"id": "r1", "reply_to": "p:out:mine", **fields}, use_bin_type=True)


def _refusal(raw: bytes) -> CodecError:
    with pytest.raises(CodecError) as refused:
        decode_request(raw, limits=LIMITS)
    return refused.value


@pytest.mark.parametrize(("fields", "message"), [
    ({"prompt": "x", "params": {"logit_bias": {str(n): 1.0 for n in range(17)}}},
     "params.logit_bias holds 17 entries; at most 16 entries are accepted (--max-logit-bias)"),
    ({"prompt": "x", "params": {"stop": ["s"] * 9}}, "params.stop holds 9 items; at most 8 items are accepted "
                                                     "(--max-stop-strings)"),
    ({"prompt": "x", "params": {"custom_token_bans": [1] * 33}}, "params.custom_token_bans holds 33 items; at most "
                                                                 "32 items are accepted (--max-token-bans)"),
    ({"prompt": "x" * 4001}, "prompt is 4001 bytes long; at most 4000 bytes are accepted (1000 characters: "
                             "max_model_len x --max-prompt-chars-per-token)"),
    ({"prompt_token_ids": [1] * 1001}, "prompt_token_ids holds 1001 items; at most 1000 items are accepted "
                                       "(max_model_len x --max-prompt-chars-per-token)"),
    ({"prompt": "x", "images": [b"\x89PNG" * 1025]}, "images holds a binary value of 4100 bytes; at most 4096 "
                                                     "bytes are accepted in one binary value on the wire "
                                                     "(--max-image-bytes)"),
    ({"prompt": "x", "params": {"max_tokens": 2, "guided_json": {"properties": {
        str(n): {} for n in range(MAX_NESTED_ITEMS + 1)}}}},
     f"params.guided_json holds a map of {MAX_NESTED_ITEMS + 1} entries; at most {MAX_NESTED_ITEMS} entries are "
     "accepted in one map on the wire"),
])
def test_each_limit_names_the_field_and_where_it_comes_from(fields: dict, message: str) -> None:
    refused = _refusal(_raw(**fields))
    assert str(refused) == message
    assert (refused.request_id, refused.reply_to) == ("r1", "p:out:mine")  # so it is answered


def test_an_oversized_map_is_refused_at_its_header_without_decoding_the_rest() -> None:
    """The map is cut short: a decoder that read it whole would report the truncation instead."""
    raw = _raw(prompt="x", params={"logit_bias": {str(n): 1.0 for n in range(290_000)}})
    started = time.perf_counter()
    refused = _refusal(raw[:len(raw) // 2])
    assert time.perf_counter() - started < 0.1
    assert str(refused).startswith("params.logit_bias holds 290000 entries; at most 16")


def test_a_map_or_list_too_big_anywhere_is_refused_naming_its_top_level_field() -> None:
    parts = [{"type": "text", "text": "a"}] * (MAX_NESTED_ITEMS + 1)
    refused = _refusal(_raw(messages=[{"role": "user", "content": parts}]))
    assert str(refused) == (f"messages holds a list of {MAX_NESTED_ITEMS + 1} items; at most {MAX_NESTED_ITEMS} "
                            "items are accepted in one list on the wire")


def test_entries_within_the_limits_decode_as_without_them() -> None:
    entries = [
        _raw(prompt="é" * 1000, params={"stop": ["a"] * 8, "logit_bias": {"5": 1.0}, "max_tokens": 3}),
        _raw(prompt_token_ids=[3] * 1000, deadline_ms=5, lora="sql"),
        _raw(messages=[{"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "image"}]}],
             images=[b"\x00" * 4096]),
    ]
    for raw in entries:
        assert decode_request(raw, limits=LIMITS) == decode_request(raw)


@pytest.mark.parametrize("raw", [
    _raw(prompt="x")[:-1],  # truncated
    _raw(prompt="x") + b"\xc0",  # trailing bytes
    b"\x82\xa2id\xa2r1\xa6prompt\xa3\xed\xa0\x80",  # invalid UTF-8
    b"\x83\xa2id\xa2r1\xa6prompt\xa2hi\xa6params\x81\xa1x" + b"\x91" * 100_000 + b"\xc0",  # nested too deep
    msgpack.packb([1, 2, 3]),  # not a map
])
def test_malformed_entries_get_the_decoders_own_error(raw: bytes) -> None:
    with pytest.raises(CodecError) as unlimited:
        decode_request(raw)
    assert str(_refusal(raw)) == str(unlimited.value)


def test_the_limits_follow_the_deployment() -> None:
    limits = WireLimits.of(max_prompt_chars=2048 * 64, max_image_bytes=20 * 2**20, max_stop_strings=64,
                           max_logit_bias=1024, max_token_bans=4096)
    assert limits.fields["prompt"].size == 4 * 2048 * 64  # a character is at most 4 UTF-8 bytes
    assert limits.fields["params.logit_bias"].items == 1024
    assert limits.max_bin_bytes == 20 * 2**20
    assert limits.max_str_bytes > 4 * 20 * 2**20 // 3  # an image_url part's base64 data URI fits


_scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**63, 2**64 - 1), st.floats(), st.text(max_size=40),
                     st.binary(max_size=40), st.builds(msgpack.ExtType, st.integers(0, 127), st.binary(max_size=4)))
_values = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=40) | st.dictionaries(
    st.text(max_size=8), inner, max_size=20), max_leaves=60)
_fields = st.dictionaries(st.sampled_from(["id", "prompt", "prompt_token_ids", "messages", "params", "images",
                                           "tools", "reply_to", "extra"]), _values, max_size=6)


@settings(max_examples=300, deadline=None)
@given(fields=_fields, params=st.dictionaries(st.sampled_from(["stop", "logit_bias", "max_tokens", "x"]), _values),
       cut=st.integers(0, 8))
def test_limits_only_ever_add_a_refusal(fields: dict, params: dict, cut: int) -> None:
    """Whatever the entry: within the limits it decodes (or fails) exactly as without them; over
    them it is a CodecError that says which limit."""
    raw = msgpack.packb({**fields, "params": params}, use_bin_type=True)
    raw = raw[:len(raw) - cut]
    try:
        unlimited: object = decode_request(raw)
    except CodecError as error:
        unlimited = str(error)
    try:
        limited: object = decode_request(raw, limits=LIMITS)
    except CodecError as error:
        limited = str(error)
        if limited != unlimited:
            assert "are accepted" in limited
            return
    assert limited == unlimited
