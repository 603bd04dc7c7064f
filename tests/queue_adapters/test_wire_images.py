"""OpenAI image_url parts on the wire become image parts and bytes, in their order (wire_images.py)."""

from __future__ import annotations

import base64
import re

import pytest

from queue_adapters.chat_message import ImagePart, TextPart
from queue_adapters.codec import WireRequest, decode_request, encode
from queue_adapters.data_uri import decode_data_uri
from queue_adapters.wire_images import resolve_image_urls


def _url(data: bytes) -> dict:
    return {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(data).decode()}}


def _decoded(content: list, images: list[bytes] | None = None) -> WireRequest:
    return decode_request(encode(WireRequest(id="r", messages=[{"role": "user", "content": content}], images=images)))


def test_image_parts_of_both_forms_keep_their_order() -> None:
    request = resolve_image_urls(_decoded([_url(b"one"), {"type": "image"}, {"type": "text", "text": "t"},
                                           _url(b"three")], images=[b"two"]))
    assert request.images == [b"one", b"two", b"three"]
    assert [type(part) for part in request.messages[0].content] == [ImagePart, ImagePart, TextPart, ImagePart]


def test_a_request_without_image_urls_is_left_as_it_is() -> None:
    request = _decoded([{"type": "image"}], images=[b"x"])
    assert resolve_image_urls(request) is request


def test_more_image_parts_than_images_is_an_error() -> None:
    with pytest.raises(ValueError, match=re.escape("more {type: image} parts than images")):
        resolve_image_urls(_decoded([_url(b"one"), {"type": "image"}]))


def test_the_size_limit_is_checked_before_decoding() -> None:
    url = "data:image/png;base64," + base64.b64encode(b"x" * 300).decode()
    assert decode_data_uri(url, "u", max_bytes=300) == b"x" * 300
    with pytest.raises(ValueError, match="u holds about 300 bytes; the limit is 100"):
        decode_data_uri(url, "u", max_bytes=100)
    with pytest.raises(ValueError, match="the limit is 100"):  # not even valid base64: refused on its length
        decode_data_uri("data:image/png;base64," + "@" * 4000, "u", max_bytes=100)
