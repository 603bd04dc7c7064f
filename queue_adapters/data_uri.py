"""Base64 `data:` URIs, the one way images travel inline in OpenAI's content parts: decoded here,
within a size limit checked before decoding, with errors naming the field. URLs are never fetched
(no network access is assumed, and fetching arbitrary URLs from a server is a hazard)."""

from __future__ import annotations

import base64
import binascii


def decode_data_uri(url: str, where: str, max_bytes: int | None = None) -> bytes:
    """'data:image/png;base64,iVBO...' -> the bytes; ValueError naming `where` for anything else, and
    for a payload that would decode to more than `max_bytes` (checked on its length, before decoding)."""
    header, comma, payload = url.partition(",")
    if not header.startswith("data:") or not comma:
        raise ValueError(f"{where} must be a data: URI (data:image/png;base64,...); image URLs are not fetched")
    if not header.endswith(";base64"):
        raise ValueError(f"{where} must be base64-encoded (data:<type>;base64,...)")
    if max_bytes is not None and len(payload) // 4 * 3 > max_bytes + 2:  # 4 characters hold 3 bytes
        raise ValueError(f"{where} holds about {len(payload) // 4 * 3} bytes; the limit is {max_bytes} "
                         "(--max-image-bytes)")
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as error:
        raise ValueError(f"{where} is not valid base64: {error}") from None
