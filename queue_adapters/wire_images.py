"""OpenAI `image_url` parts in wire chat messages -> `{type: image}` parts and the request's `images`.

A client writing to Redis may send messages as it would send them to the gateway:

    content: [{type: text, text: "What is"}, {type: image_url, image_url: {url: "data:image/png;base64,..."}}]

or in the wire's own form, `{type: image}` placeholders with the bytes in `images` (what the gateway
sends). Both may appear in one request: the images keep the order of their parts, an `image` part
taking the next of `images`, an `image_url` part its own decoded bytes.
"""

from __future__ import annotations

import msgspec

from queue_adapters.chat_message import ChatMessage, ImagePart, ImageUrlPart
from queue_adapters.codec import WireRequest
from queue_adapters.data_uri import decode_data_uri


def has_image_urls(request: WireRequest) -> bool:
    return any(isinstance(part, ImageUrlPart) for message in request.messages or ()
               if not isinstance(message.content, str) for part in message.content)


def resolve_image_urls(request: WireRequest, max_image_bytes: int | None = None) -> WireRequest:
    """`request` with every image_url part decoded into an image part and its bytes, in order;
    ValueError naming the part for a URL that is not a base64 data: URI or is over `max_image_bytes`."""
    if not has_image_urls(request):
        return request
    given = list(request.images or [])
    if sum(isinstance(part, ImagePart) for message in request.messages or () if not isinstance(message.content, str)
           for part in message.content) > len(given):
        raise ValueError("messages hold more {type: image} parts than images")
    images: list[bytes] = []
    messages = [_resolved(message, f"messages[{index}].content", given, images, max_image_bytes)
                for index, message in enumerate(request.messages or ())]
    return msgspec.structs.replace(request, messages=messages, images=[*images, *given])


def _resolved(message: ChatMessage, where: str, given: list[bytes], images: list[bytes],
              max_image_bytes: int | None) -> ChatMessage:
    if isinstance(message.content, str):
        return message
    parts = []
    for index, part in enumerate(message.content):
        if isinstance(part, ImageUrlPart):
            images.append(decode_data_uri(part.image_url.url, f"{where}[{index}].image_url.url", max_image_bytes))
            part = ImagePart()
        elif isinstance(part, ImagePart):
            images.append(given.pop(0))
        parts.append(part)
    return msgspec.structs.replace(message, content=parts)
