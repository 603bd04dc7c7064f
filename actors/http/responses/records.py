"""A stored response as the store keeps it: one JSON text (ASCII, so its length is its size in bytes)

    {"response": {the Response object}, "input_items": [the request's own items],
     "context": [every item its prompt rendered, but the instructions]}

Continuing it (`previous_response_id`) renders its context and its output, then the new input: so a
conversation is self-contained in its last record, and evicting older ones never breaks it. Since
every turn renders the whole conversation again, a conversation is bounded: at most
MAX_CONVERSATION_ITEMS items and MAX_CONVERSATION_BYTES of JSON (a 400 before generating).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

MAX_CONVERSATION_ITEMS = 1000
MAX_CONVERSATION_BYTES = 4 * 1024 * 1024
_RESPONSE_ID = re.compile(r"resp_[0-9a-f]{32}")  # input_items.new_id("resp"): the only ids ever stored


def is_response_id(text: str) -> bool:
    """Whether `text` could name a stored response (anything else is unknown without asking the store)."""
    return _RESPONSE_ID.fullmatch(text) is not None


@dataclass(slots=True)
class Record:
    response: dict[str, Any]
    input_items: list[dict[str, Any]]
    context: list[dict[str, Any]]

    def encode(self) -> str:
        return json.dumps({"response": self.response, "input_items": self.input_items, "context": self.context},
                          separators=(",", ":"))

    @staticmethod
    def decode(text: str) -> Record:
        value = json.loads(text)
        return Record(value["response"], value["input_items"], value["context"])

    def continued(self) -> list[dict[str, Any]]:
        """The items a response that continues this one renders before its own input."""
        return [*self.context, *self.response["output"]]


def check_conversation(items: list[dict[str, Any]]) -> int:
    """The conversation's size in bytes of JSON; ValueError when it is past its bounds."""
    if len(items) > MAX_CONVERSATION_ITEMS:
        raise ValueError(f"the conversation (previous_response_id's items and input) holds {len(items)} items; "
                         f"at most {MAX_CONVERSATION_ITEMS} are kept")
    size = len(json.dumps(items, separators=(",", ":")))
    if size > MAX_CONVERSATION_BYTES:
        raise ValueError(f"the conversation (previous_response_id's items and input) is {size} bytes of JSON; "
                         f"at most {MAX_CONVERSATION_BYTES} are kept")
    return size
