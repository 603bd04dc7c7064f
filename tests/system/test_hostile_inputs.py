"""Hostile values are refused at every edge (HTTP body, batch line, wire entry) with an error that
names the field, and a request whose data still makes a stage raise fails alone: the others' tokens
do not change and the service stays up (issue: one request can never take the service down)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import httpx
import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from actors.cli.batch import read_batch_file
from actors.http.app import create_app
from actors.http.backends import EmbeddedBackend
from actors.http.options import GatewayOptions
from pipeline.output.output_processor import OutputProcessor
from pipeline.request.outputs import TokenEvent
from pipeline.request.sampling_params import SamplingParams
from pipeline.request.untrusted import INT64_MAX, MAX_NESTING, UntrustedValueError, check_untrusted, loads_json
from queue_adapters.codec import CodecError, WireRequest, decode_request
from tests.support.engine_helpers import make_engine

SURROGATES = st.sampled_from(["\ud800", "\udfff", "a\udc80b", "\ud83d"])  # lone halves of a pair
HUGE_INTS = st.one_of(st.integers(INT64_MAX + 1, 2**200), st.integers(-(2**200), -(2**63) - 1))


def _nested(depth: int, leaf: object = 1) -> object:
    value = leaf
    for index in range(depth):
        value = [value] if index % 2 else {"k": value}
    return value


# ---- the checks themselves ---------------------------------------------------------------------

hostile_leaves = st.one_of(SURROGATES, HUGE_INTS, st.sampled_from([float("nan"), float("inf"), -float("inf")]),
                           st.just(_nested(MAX_NESTING + 1)))
plain_leaves = st.one_of(st.none(), st.booleans(), st.integers(-(2**63), INT64_MAX), st.text(max_size=8),
                         st.floats(allow_nan=False, allow_infinity=False))


def _containing(leaf: st.SearchStrategy) -> st.SearchStrategy:
    """A plain JSON-like value with `leaf` somewhere inside it (as a value or as a map key)."""
    return st.recursive(leaf, lambda inner: st.one_of(
        st.builds(lambda items, bad, at: [*items[:at], bad, *items[at:]], st.lists(plain_leaves, max_size=3), inner,
                  st.integers(0, 3)),
        st.builds(lambda items, key, bad: {**items, key: bad},
                  st.dictionaries(st.text(max_size=4), plain_leaves, max_size=3), st.text(max_size=4), inner)),
        max_leaves=4)


@settings(max_examples=300, deadline=None)
@given(value=_containing(hostile_leaves))
def test_a_hostile_value_anywhere_is_refused_naming_where(value: object) -> None:
    with pytest.raises(UntrustedValueError) as refused:
        check_untrusted(value)
    assert "must" in str(refused.value) or "not valid Unicode" in str(refused.value) or "nested" in str(
        refused.value)


@settings(max_examples=300, deadline=None)
@given(value=st.recursive(plain_leaves, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
    st.text(max_size=4), inner, max_size=3), max_leaves=10))
def test_plain_values_pass_and_survive_a_json_round_trip(value: object) -> None:
    check_untrusted(value)
    assert loads_json(json.dumps(value)) == value


@pytest.mark.parametrize(("text", "field"), [
    ('{"prompt": "\\ud800"}', "prompt"),
    ('{"messages": [{"role": "user", "content": [{"type": "text", "text": "x\\udfff"}]}]}', "messages"),
    ('{"logit_bias": {"\\ud800": 1}}', "logit_bias"),
    ('{"seed": 9223372036854775808}', "seed"),
    ('{"seed": -9223372036854775809}', "seed"),
    ('{"temperature": NaN}', None),
    ('{"temperature": -Infinity}', None),
    ('{"x": ' + "[" * 100_000 + "]" * 100_000 + "}", None),  # Python's parser itself gives up (RecursionError)
    ('{"x": ' + "[" * 200 + "]" * 200 + "}", "x"),  # parsed, then refused by depth
    ('{"n": ' + "9" * 5000 + "}", None),  # more digits than Python converts
])
def test_json_bodies_that_used_to_reach_the_engine_are_refused(text: str, field: str | None) -> None:
    with pytest.raises(UntrustedValueError) as refused:
        loads_json(text.encode())
    assert refused.value.field == field


def test_every_int_parameter_is_bounded_to_int64() -> None:
    for name in ("seed", "max_tokens", "top_k", "n", "logprobs", "truncate_prompt_tokens", "dry_range"):
        with pytest.raises(ValueError, match=name):
            SamplingParams.from_dict({name: 2**63})
    assert SamplingParams(seed=-(2**63)).seed == -(2**63) and SamplingParams(seed=INT64_MAX).seed == INT64_MAX


def test_float_parameters_fit_a_float32() -> None:
    # 1e300 is a finite JSON number that the sampler's float32 rows would hold as inf
    for name in ("temperature", "presence_penalty", "mirostat_tau", "logit_bias"):
        value = {"5": 1e300} if name == "logit_bias" else 1e300
        with pytest.raises(ValueError, match="32-bit float"):
            SamplingParams.from_dict({name: value})
    assert SamplingParams.from_dict({"temperature": 1e38}).temperature == 1e38


# ---- the wire codec ----------------------------------------------------------------------------

def _raw_request(**fields: object) -> bytes:
    # surrogatepass: a lone surrogate goes out as its three CESU-8 bytes, as a careless producer's would
    return msgpack.packb({"id": "r1", "prompt": "hi", **fields}, use_bin_type=True, unicode_errors="surrogatepass")


RAW_HOSTILE_ENTRIES = [
    # a str holding a UTF-8-encoded surrogate (CESU-8), which no UTF-8 decoder accepts
    b"\x82\xa2id\xa2r1\xa6prompt\xa3\xed\xa0\x80",
    b"\x82\xa2id\xa2r1\xa6prompt\xc4\x02hi",  # bin where a str belongs
    _raw_request(params={"seed": 2**64 - 1}),
    _raw_request(params={"seed": msgpack.ExtType(3, b"xx")}),
    _raw_request(params={"stop": [msgpack.Timestamp(0)]}),  # the timestamp ext type (a datetime)
    _raw_request(params={"logit_bias": {2**64 - 1: 1.0}}),
    _raw_request(params={"temperature": float("nan")}),
    _raw_request(deadline_ms=2**64 - 1),
    _raw_request(params={"x": _nested(200)}),
    b"\x83\xa2id\xa2r1\xa6prompt\xa2hi\xa6params\x81\xa1x" + b"\x91" * 100_000 + b"\xc0",  # msgspec's own limit
]


@pytest.mark.parametrize("raw", RAW_HOSTILE_ENTRIES)
def test_hostile_wire_entries_are_codec_errors_that_keep_the_id(raw: bytes) -> None:
    with pytest.raises(CodecError) as refused:
        decode_request(raw)
    assert refused.value.request_id == "r1"  # so the producer gets an error reply, whatever is wrong


# What msgpack can carry: ints up to 2**64 - 1 (uint64), extension types, and the rest as in JSON.
wire_hostile_leaves = st.one_of(
    SURROGATES, st.integers(INT64_MAX + 1, 2**64 - 1), st.sampled_from([float("nan"), float("inf")]),
    st.just(_nested(MAX_NESTING + 1)), st.builds(msgpack.ExtType, st.integers(0, 127), st.binary(max_size=4)),
    st.builds(msgpack.Timestamp, st.integers(0, 2**32 - 1)))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(params=st.dictionaries(st.sampled_from(["seed", "stop", "max_tokens", "logit_bias", "top_k", "x"]),
                              _containing(wire_hostile_leaves), min_size=1))
def test_wire_params_holding_hostile_values_never_decode(params: dict) -> None:
    raw = _raw_request(params=params)
    with pytest.raises(CodecError):
        decode_request(raw)


# ---- the batch file ----------------------------------------------------------------------------

def test_hostile_batch_lines_are_their_own_errors(tmp_path: Path) -> None:
    good = {"custom_id": "good", "url": "/v1/completions", "body": {"prompt": "hi", "max_tokens": 2}}
    lines = [json.dumps(good).encode()]
    for index, body in enumerate(['{"prompt": "\\ud800"}', '{"prompt": "hi", "seed": 18446744073709551615}',
                                  '{"prompt": "hi", "temperature": NaN}', '{"prompt": "hi", "x": ' + "[" * 5000
                                  + "]" * 5000 + "}"]):
        lines.append(b'{"custom_id": "bad-%d", "url": "/v1/completions", "body": ' % index + body.encode() + b"}")
    lines.append(b'{"custom_id": "latin-1", "url": "/v1/completions", "body": {"prompt": "caf\xe9"}}')  # not UTF-8
    # U+2028 inside a string: a line separator to str.splitlines, plain text to JSON
    lines.append(json.dumps({**good, "custom_id": "good-2", "body": {"prompt": "a\u2028b"}},
                            ensure_ascii=False).encode())
    path = tmp_path / "batch.jsonl"
    path.write_bytes(b"\n".join(lines))
    parsed = read_batch_file(path)
    assert [line.request is not None for line in parsed] == [True, False, False, False, False, False, True]
    assert all(line.error for line in parsed[1:6])


# ---- a request's fault stays in that request -----------------------------------------------------

GOOD_BODY = {"prompt": "The quick brown fox", "max_tokens": 8, "temperature": 0, "ignore_eos": True}
HOSTILE_BODIES = [
    b'{"prompt": "\\ud800", "max_tokens": 2}',
    b'{"prompt": "ok", "stream": true, "stop": ["a\\udc00"]}',
    b'{"messages": [{"role": "\\udfff", "content": "hi"}], "stream": true}',
    b'{"messages": [{"role": "user", "content": [{"type": "text", "text": "\\ud83d"}]}]}',
    b'{"prompt": "hi", "seed": 18446744073709551615}',
    b'{"prompt": "hi", "max_tokens": 100000000000000000000000000000}',
    b'{"prompt": [5, 99999999999999999999999]}',
    b'{"prompt": "hi", "top_p": Infinity}',
    b'{"prompt": "hi", "logit_bias": {"\\u00b2": 5}}',
    b'{"prompt": "hi", "user": "\\ud800"}',
    b'{"prompt": "hi", "n": ' + b"[" * 3000 + b"]" * 3000 + b"}",
    b'{"prompt": "hi", "stop": ' + b'{"a":' * 100 + b"1" + b"}" * 100 + b"}",
]


async def _post(client: httpx.AsyncClient, path: str, body: bytes | dict) -> tuple[httpx.Response, float]:
    started = time.monotonic()
    if isinstance(body, dict):
        response = await client.post(path, json=body)
    else:
        response = await client.post(path, content=body, headers={"content-type": "application/json"})
    return response, time.monotonic() - started


@pytest.fixture(scope="module")
def model_dir(default_model_path: Path) -> Path:
    return default_model_path


async def test_hostile_bodies_beside_good_requests_leave_the_good_tokens_unchanged(model_dir: Path) -> None:
    backend = EmbeddedBackend(make_engine(model_dir))
    app = create_app(backend, GatewayOptions())
    await backend.start()
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway", timeout=30) as client:
            alone, _ = await _post(client, "/v1/completions", GOOD_BODY)
            reference = alone.json()["choices"][0]["token_ids"]
            goods = [_post(client, "/v1/completions", GOOD_BODY) for _ in range(4)]
            bads = [_post(client, path, body) for body in HOSTILE_BODIES
                    for path in ("/v1/completions", "/v1/chat/completions")]
            bads += [_post(client, "/tokenize", b'{"prompt": "\\ud800"}'),
                     _post(client, "/tokenize", b'{"messages": [{"role": "user", "content": "x\\udfff"}]}'),
                     _post(client, "/detokenize", b'{"tokens": [1180591620717411303424]}'),
                     _post(client, "/detokenize", b'{"tokens": [4294967296]}')]
            results = await asyncio.gather(*goods, *bads)
            for response, seconds in results[len(goods):]:
                assert 400 <= response.status_code < 500, response.text
                assert seconds < 10
                assert set(response.json()["error"]) == {"message", "type", "param", "code"}
            for response, _ in results[:len(goods)]:
                assert response.status_code == 200 and response.json()["choices"][0]["token_ids"] == reference
            assert await backend.healthy()
    finally:
        await backend.close()


async def test_a_request_that_makes_intake_raise_fails_alone(model_dir: Path) -> None:
    """Past the edge (a wire request built in this process): the tokenizer and the chat template
    raise on these; each is that request's error reply and the graph goes on."""
    backend = EmbeddedBackend(make_engine(model_dir))
    await backend.start()
    params = {"max_tokens": 6, "temperature": 0, "ignore_eos": True}
    poisoned = [WireRequest(id="p-surrogate", prompt="\ud800", params=params),
                WireRequest(id="p-role", messages=[{"role": "user", "content": "a\udfff"}], params=params),
                WireRequest(id="p-ids", prompt_token_ids=[2**40], params=params)]
    good = [WireRequest(id=f"good-{i}", prompt="Once upon a time", params=params) for i in range(3)]
    try:
        async def run(request: WireRequest) -> list:
            await backend.submit(request)
            return [reply async for reply in backend.replies(request)]

        replies = await asyncio.wait_for(asyncio.gather(*(run(r) for r in [*good[:1], *poisoned, *good[1:]])), 60)
        outcomes = dict(zip([r.id for r in [*good[:1], *poisoned, *good[1:]]], replies, strict=True))
        for request in poisoned:
            assert outcomes[request.id][-1].error is not None, request.id
        tokens = [[t for entry in outcomes[r.id] for c in entry.choices for t in c.token_ids] for r in good]
        assert len(tokens[0]) == 6 and tokens[0] == tokens[1] == tokens[2]
        assert await backend.healthy()
    finally:
        await backend.close()


class _ExplodingMatcher:
    def feed(self, text: str) -> tuple[str, str | None]:
        raise RuntimeError("a stop matcher bug")

    def flush(self) -> str:
        return ""


def test_a_request_whose_output_processing_raises_fails_alone(model_dir: Path) -> None:
    from pipeline.loading.tokenizer import load_tokenizer

    outputs = OutputProcessor(load_tokenizer(model_dir))
    params = SamplingParams(max_tokens=4)
    for request_id in ("good", "bad", "good-2"):
        outputs.add_request(request_id, [5, 6, 7], params)
    outputs._requests["bad"].choices[0].stop_matcher = _ExplodingMatcher()  # what a bug would do
    events = [TokenEvent(request_id, 0, token) for token in (40, 41) for request_id in ("good", "bad", "good-2")]
    deltas, _ = outputs.process(events)
    by_id = {delta.request_id: delta for delta in deltas}
    assert by_id["bad"].error["code"] == "request_failed" and "stop matcher bug" in by_id["bad"].error["message"]
    assert by_id["good"].choices[0].token_ids == [40, 41] == by_id["good-2"].choices[0].token_ids
    assert outputs.take_failed() == ["bad"] and outputs.take_failed() == []
    later, _ = outputs.process([TokenEvent("bad", 0, 42), TokenEvent("good", 0, 42)])
    assert [delta.request_id for delta in later] == ["good"]  # the failed one is answered and forgotten
