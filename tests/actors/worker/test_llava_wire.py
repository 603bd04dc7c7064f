"""Images on the wire (`images` + `<image>` placeholders), in batch-file chat lines and through the gateway
(OpenAI image_url parts with data URIs): the same tokens as HF, and clear errors for bad images."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from tqdm import tqdm

from actors.cli.batch import read_batch_file, run_embedded, run_offline
from actors.http.backends import EmbeddedBackend
from actors.http.openai.chat_request import parse_chat_request
from actors.http.options import GatewayOptions
from actors.kit.message_codec import decode_message, encode_message
from actors.kit.messages import Admit
from actors.worker.intake import build_request
from pipeline.engine import LLMEngine
from queue_adapters.chat_message import ImagePart, TextPart
from queue_adapters.codec import CodecError, WireRequest, decode_request, encode
from tests.support.engine_helpers import assert_greedy_equal, make_engine
from tests.support.gateway_helpers import serving
from tests.support.hf_llava import MAX_TOKENS, HFReference, make_tiny_llava, random_image_bytes


def data_uri(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


def image_part(data: bytes) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": data_uri(data)}}


@pytest.fixture(scope="module")
def llava_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_llava(tmp_path_factory.mktemp("llava-wire") / "tiny-llava", seed=3)


@pytest.fixture(scope="module")
def hf(llava_dir: Path) -> HFReference:
    return HFReference(llava_dir)


@pytest.fixture(scope="module")
def engine(llava_dir: Path) -> LLMEngine:
    return make_engine(llava_dir, block_size=8, num_kv_blocks=256)


def hf_chat(hf: HFReference, messages: list[dict[str, Any]], images: list[bytes]) -> tuple[list[int], Any]:
    """HF's tokens for chat messages in the template's content-part form ({type: image} per image)."""
    parts = [{**m, "content": [{"type": "image"} if p["type"] == "image_url" else p for p in m["content"]]}
             if isinstance(m["content"], list) else m for m in messages]
    prompt = hf.tokenizer.apply_chat_template(parts, tokenize=False, add_generation_prompt=True)
    _, tokens, logits = hf.generate(prompt, images)
    return tokens, logits


# ---- codec and parsing --------------------------------------------------------------------------

def test_images_and_content_parts_round_trip_the_codec() -> None:
    request = WireRequest(id="r", messages=[{"role": "user", "content": [TextPart(text="hi"), ImagePart()]}],
                          images=[b"\x89PNG..."])
    decoded = decode_request(encode(request))
    assert decoded.images == [b"\x89PNG..."]
    assert decoded.messages[0].as_dict() == {"role": "user", "content": [{"type": "text", "text": "hi"},
                                                                        {"type": "image"}]}


@pytest.mark.parametrize(("entry", "message"), [
    ({"id": "r", "prompt": "<image>", "images": ["a string"]}, "images[0] must be bytes, got a string"),
    ({"id": "r", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
     "messages[0].content[0].image_url is required"),
    ({"id": "r", "messages": [{"role": "user", "content": [{"type": "input_audio"}]}]},
     "messages[0].content[0].type must be one of text, image, image_url, got 'input_audio'"),
    ({"id": "r", "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {
        "url": "data:image/png;base64,AAAA", "detail": "high"}}]}]},
     "messages[0].content[0].image_url.detail must be one of auto, got 'high'"),
    ({"id": "r", "messages": [{"role": "user", "content": [{"type": "text"}]}]},
     "messages[0].content[0].text is required"),
])
def test_bad_image_fields_are_codec_errors_naming_the_field(entry: dict[str, Any], message: str) -> None:
    with pytest.raises(CodecError) as error:
        decode_request(encode(entry))
    assert str(error.value) == message and error.value.request_id == "r"


def test_chat_image_url_parts_become_image_parts_and_bytes() -> None:
    image = random_image_bytes(1)
    body = {"messages": [{"role": "user", "content": [{"type": "text", "text": "What is"}, image_part(image),
                                                      {"type": "image_url", "image_url": {"url": data_uri(b"x"),
                                                                                          "detail": "auto"}}]}]}
    chat = parse_chat_request(body, tool_parser=None)
    messages, images = chat.messages, chat.images
    assert images == [image, b"x"]
    assert [type(part) for part in messages[0].content] == [TextPart, ImagePart, ImagePart]


@pytest.mark.parametrize(("part", "message"), [
    ({"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}, "must be a data: URI"),
    ({"type": "image_url", "image_url": {"url": "data:image/png,rawbytes"}}, "must be base64-encoded"),
    ({"type": "image_url", "image_url": {"url": "data:image/png;base64,@@@"}}, "is not valid base64"),
    ({"type": "image_url", "image_url": {"url": data_uri(b"x"), "detail": "high"}}, "detail must be auto"),
    ({"type": "input_audio", "input_audio": {}}, "type must be text or image_url"),
])
def test_bad_image_url_parts_are_errors_naming_the_part(part: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=r"messages\[0\].content\[0\]") as error:
        parse_chat_request({"messages": [{"role": "user", "content": [part]}]}, tool_parser=None)
    assert message in str(error.value)


def test_wire_image_url_parts_read_as_the_gateway_s_form(engine: LLMEngine) -> None:
    """One request shape everywhere: OpenAI's image_url parts on the wire give the request that the
    gateway's form ({type: image} parts + images) gives, mixed in one message too."""
    first, second = random_image_bytes(40), random_image_bytes(41, 48, 40)
    openai_form = WireRequest(id="r", messages=[{"role": "user", "content": [
        {"type": "text", "text": "Compare "}, image_part(first), {"type": "text", "text": " and "},
        image_part(second)]}], params={"max_tokens": MAX_TOKENS, "temperature": 0})
    gateway_form = WireRequest(id="r", messages=[{"role": "user", "content": [
        TextPart(text="Compare "), ImagePart(), TextPart(text=" and "), ImagePart()]}], images=[first, second],
        params=openai_form.params)
    mixed = WireRequest(id="r", messages=[{"role": "user", "content": [
        TextPart(text="Compare "), image_part(first), TextPart(text=" and "), ImagePart()]}], images=[second],
        params=openai_form.params)
    expected = build_request(engine.builder, decode_request(encode(gateway_form)))
    for form in (openai_form, mixed):
        built = build_request(engine.builder, decode_request(encode(form)))
        assert built.prompt_token_ids == expected.prompt_token_ids
        assert built.images == expected.images and len(built.images) == 2


def test_wire_image_url_errors_name_the_part_and_the_size_limit_holds(engine: LLMEngine) -> None:
    def refusal(url: str) -> str:
        request = WireRequest(id="r", messages=[{"role": "user", "content": [
            {"type": "text", "text": "x"}, {"type": "image_url", "image_url": {"url": url}}]}])
        with pytest.raises(ValueError) as error:
            build_request(engine.builder, decode_request(encode(request)))
        return str(error.value)

    assert refusal("data:image/png;base64,@@@").startswith("messages[0].content[1].image_url.url is not valid base64")
    assert "image URLs are not fetched" in refusal("https://example.com/cat.png")
    over = engine.builder.image_processor.limits.max_bytes + 1024
    assert "the limit is" in refusal("data:image/png;base64," + "A" * (over // 3 * 4))
    assert "is not a decodable image" in refusal(data_uri(b"\x89PNG broken"))


def test_admit_carries_the_images_over_a_redis_edge(engine: LLMEngine) -> None:
    request = engine.builder.build("r", engine_params(), prompt="<image> here", images=[random_image_bytes(2)])
    decoded = decode_message(encode_message(Admit.of(request, None)))
    assert decoded.to_request().images == request.images


def engine_params() -> Any:
    from pipeline.request.sampling_params import SamplingParams

    return SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)


# ---- batch file: engine loop and actor graph ----------------------------------------------------

@pytest.fixture(scope="module")
def batch_lines(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[Any], dict[str, Any]]:
    images = [random_image_bytes(20), random_image_bytes(21, 64, 36)]
    bodies = {
        "chat-one-image": {"messages": [{"role": "user", "content": [
            {"type": "text", "text": "Describe "}, image_part(images[0]), {"type": "text", "text": " briefly"}]}]},
        "chat-two-images": {"messages": [
            {"role": "user", "content": [image_part(images[1]), {"type": "text", "text": " and "},
                                         image_part(images[0])]}]},
        "chat-text-only": {"messages": [{"role": "user", "content": "Just words"}]},
        "chat-broken-image": {"messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": data_uri(b"not a png")}}]}]},
    }
    source = tmp_path_factory.mktemp("batch") / "in.jsonl"
    source.write_text("\n".join(json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
                                            "body": {**body, "max_tokens": MAX_TOKENS, "temperature": 0,
                                                     "ignore_eos": True}})
                                for custom_id, body in bodies.items()) + "\n")
    return read_batch_file(source), {"images": images, "bodies": bodies}


def test_batch_chat_lines_with_images_equal_hf_on_both_paths(engine: LLMEngine, hf: HFReference,
                                                             batch_lines: tuple[list[Any], dict[str, Any]]) -> None:
    lines, data = batch_lines
    requests = [line.request for line in lines]
    offline = run_offline(engine, requests, tqdm(disable=True))
    graph = asyncio.run(run_embedded(engine, requests, tqdm(disable=True)))
    by_custom_id = {line.custom_id: line.request.id for line in lines}
    for custom_id, body in data["bodies"].items():
        ours, through_graph = offline[by_custom_id[custom_id]], graph[by_custom_id[custom_id]]
        if custom_id == "chat-broken-image":
            assert "images[0] is not a decodable image" in ours["error"]["message"]
            assert through_graph["error"] == ours["error"]
            continue
        line_images = [base64.b64decode(part["image_url"]["url"].partition(",")[2])
                       for message in body["messages"] if isinstance(message["content"], list)
                       for part in message["content"] if part["type"] == "image_url"]
        theirs, logits = hf_chat(hf, body["messages"], line_images)
        assert_greedy_equal(ours["choices"][0]["token_ids"], theirs, logits, custom_id)
        assert through_graph["choices"][0]["token_ids"] == ours["choices"][0]["token_ids"]


# ---- gateway --------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def gateway(engine: LLMEngine) -> Iterator[str]:
    with serving(EmbeddedBackend(engine), GatewayOptions()) as base_url:
        yield base_url


def test_gateway_chat_with_an_image_url_equals_hf(gateway: str, hf: HFReference) -> None:
    image = random_image_bytes(30, 50, 40)
    messages = [{"role": "user", "content": [{"type": "text", "text": "Look: "}, image_part(image)]}]
    response = httpx.post(f"{gateway}/chat/completions", timeout=60,
                          json={"messages": messages, "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True})
    assert response.status_code == 200, response.text
    theirs, logits = hf_chat(hf, messages, [image])
    assert_greedy_equal(response.json()["choices"][0]["token_ids"], theirs, logits, "gateway")


def test_gateway_answers_a_broken_image_with_400(gateway: str) -> None:
    messages = [{"role": "user", "content": [image_part(b"\x89PNG broken")]}]
    response = httpx.post(f"{gateway}/chat/completions", json={"messages": messages, "max_tokens": 2}, timeout=60)
    assert response.status_code == 400
    assert "images[0] is not a decodable image" in response.json()["error"]["message"]


def test_gateway_of_a_text_only_model_answers_image_parts_with_400(default_model_path: Path) -> None:
    with serving(EmbeddedBackend(make_engine(default_model_path, num_kv_blocks=32)), GatewayOptions()) as base_url:
        messages = [{"role": "user", "content": [{"type": "text", "text": "hi"}, image_part(random_image_bytes(1))]}]
        response = httpx.post(f"{base_url}/chat/completions", json={"messages": messages, "max_tokens": 2}, timeout=60)
        assert response.status_code == 400
        assert "images: this model takes no images" in response.json()["error"]["message"]
        text_parts = [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
        response = httpx.post(f"{base_url}/chat/completions", json={"messages": text_parts, "max_tokens": 2},
                              timeout=60)
        assert response.status_code == 200, response.text


def test_wire_prompt_with_images_through_the_actor_graph_equals_hf(engine: LLMEngine, hf: HFReference) -> None:
    prompt = "First <image> then <image> and"
    images = [random_image_bytes(40), random_image_bytes(41, 40, 60)]
    wire = WireRequest(id="wire-images", prompt=prompt, images=images,
                       params={"max_tokens": MAX_TOKENS, "temperature": 0.0, "ignore_eos": True})
    result = asyncio.run(run_embedded(engine, [decode_request(encode(wire))], tqdm(disable=True)))["wire-images"]
    _, theirs, logits = hf.generate(prompt, images)
    assert_greedy_equal(result["choices"][0]["token_ids"], theirs, logits, "wire")
