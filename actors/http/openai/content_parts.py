"""OpenAI chat content parts -> wire content parts and image bytes.

    {"type": "text", "text": "What is this?"}                                  -> TextPart
    {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBO..."}} -> ImagePart + the
                                                                                  decoded bytes, in order

Images come inline as base64 data URIs only (queue_adapters/data_uri.py): a worker never fetches
URLs. Workers read the same parts on the wire (queue_adapters/wire_images.py). Whether the model takes images at
all, and whether the bytes are a decodable picture, is the worker's call (an error reply, which the
gateway answers with a 400).
"""

from __future__ import annotations

from typing import Any

from queue_adapters.chat_message import ImagePart, TextPart
from queue_adapters.data_uri import decode_data_uri

_DETAILS = (None, "auto")  # LLaVA sees one resolution: "low"/"high" would silently mean nothing


def parse_content(content: Any, where: str, images: list[bytes]) -> str | list[TextPart | ImagePart]:
    """A message's content: a string, or a list of parts whose images are appended to `images`."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list) or not content:
        raise ValueError(f"{where} must be a string or a non-empty list of content parts")
    return [_parse_part(part, f"{where}[{index}]", images) for index, part in enumerate(content)]


def _parse_part(part: Any, where: str, images: list[bytes]) -> TextPart | ImagePart:
    if not isinstance(part, dict):
        raise ValueError(f"{where} must be an object with a type")
    kind = part.get("type")
    if kind == "text":
        _only(part, {"type", "text"}, where)
        if not isinstance(part.get("text"), str):
            raise ValueError(f"{where}.text must be a string")
        return TextPart(text=part["text"])
    if kind == "image_url":
        _only(part, {"type", "image_url"}, where)
        images.append(_image_bytes(part.get("image_url"), f"{where}.image_url"))
        return ImagePart()
    raise ValueError(f"{where}.type must be text or image_url, got {kind!r}")


def _image_bytes(image_url: Any, where: str) -> bytes:
    if not isinstance(image_url, dict) or not isinstance(image_url.get("url"), str):
        raise ValueError(f"{where} must be an object with a url (a data: URI)")
    _only(image_url, {"url", "detail"}, where)
    if image_url.get("detail") not in _DETAILS:
        raise ValueError(f"{where}.detail must be auto when given, got {image_url['detail']!r}")
    return decode_data_uri(image_url["url"], f"{where}.url")


def _only(fields: dict[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(fields) - allowed)
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {', '.join(unknown)}")
