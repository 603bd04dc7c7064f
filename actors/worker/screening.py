"""What Intake makes of a read entry before claiming it (docs/design.md §3, "Every entry is answered").

An entry with no usable id can only be dead-lettered. Every other entry, valid or not, is claimed
under its id first (actors/worker/recovery/ownership.py), so its answer, a completion or an error,
is only ever written where that id may write: an entry that does not decode, or names a reply_to
it may not use, must not put an error entry into another request's reply stream either.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from actors.worker.recovery.ownership import fingerprint_of
from actors.worker.reply_routes import default_reply_to, reply_to_allowed, shared_stream_of
from queue_adapters.base import Delivery
from queue_adapters.codec import Malformed, WireRequest, encode


@dataclass(slots=True)
class Screened:
    """An entry with a usable id, on its way to its claim."""

    delivery: Delivery[Any]
    request_id: str
    fingerprint: str  # what it asks (fingerprint_of), or a hash of its bytes when it does not decode
    reply_to: str  # where it is answered: the stream it named, or its own when that one is refused
    shares: str = ""  # the other id whose own stream reply_to is ("" when none)
    refusal: str | None = None  # the error it gets instead of being run

    @property
    def request(self) -> WireRequest | None:
        message = self.delivery.message
        return message if isinstance(message, WireRequest) and self.refusal is None else None

    def refuse(self, reason: str, prefix: str) -> None:
        """Answered with `reason` on its own stream, never on the key it named."""
        self.refusal = reason
        self.reply_to = default_reply_to(prefix, self.request_id)
        self.shares = ""


def screen(delivery: Delivery[WireRequest | Malformed], prefix: str, pattern: str | None) -> Screened | None:
    """None for an entry without a usable id; otherwise where it is answered and what it may share."""
    message = delivery.message
    if isinstance(message, Malformed):
        if message.request_id is None:
            return None
        request_id, named, fingerprint = message.request_id, message.reply_to, raw_fingerprint(message.raw)
    else:
        request_id, named, fingerprint = message.id, message.reply_to, fingerprint_of(message)
    entry = Screened(delivery, request_id, fingerprint, named or default_reply_to(prefix, request_id))
    if not reply_to_allowed(entry.reply_to, prefix, pattern):
        allowed = pattern or f"{prefix}:out:*"
        entry.refuse(f"reply_to {entry.reply_to!r} is not allowed: it must match {allowed!r} and not be "
                     "one of the deployment's own keys", prefix)
    else:
        entry.shares = shared_stream_of(entry.reply_to, prefix, request_id)
    if isinstance(message, Malformed):
        entry.refusal = message.error
    return entry


def raw_fingerprint(raw: bytes | None) -> str:
    """An undecodable entry's fingerprint: its bytes (only the very same entry again is not a conflict)."""
    return hashlib.sha256(raw or b"").hexdigest()[:32]


def raw_of(delivery: Delivery[Any] | None) -> bytes | None:
    """The entry's bytes for a dead letter: as read when it did not decode, else re-encoded."""
    message = delivery.message if delivery is not None else None
    if isinstance(message, Malformed):
        return message.raw
    return encode(message) if isinstance(message, WireRequest) else None
