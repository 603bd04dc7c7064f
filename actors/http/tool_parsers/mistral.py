"""Mistral: `[TOOL_CALLS]` followed by a JSON list of {"name", "arguments"} objects. Call ids are 9
letters and digits: Mistral's chat templates refuse any other id when the conversation comes back.

Example: 'Sure.[TOOL_CALLS][{"name": "weather", "arguments": {"city": "Oslo"}}]' -> content 'Sure.',
one call.

Each item is a call from its head on; text after the list (or an item that is not a call) is content
again. The list's brackets may be missing (items one after another, as some templates write them).
"""

from __future__ import annotations

import secrets
import string

from actors.http.tool_parsers.call_list import ListScanner
from actors.http.tool_parsers.scanner import State

MARKER = "[TOOL_CALLS]"
_ID_CHARACTERS = string.ascii_letters + string.digits


class MistralScanner(ListScanner):
    openers = (MARKER,)

    def opened(self, marker: str) -> State:
        return self.list_start

    def new_id(self) -> str:
        return "".join(secrets.choice(_ID_CHARACTERS) for _ in range(9))
