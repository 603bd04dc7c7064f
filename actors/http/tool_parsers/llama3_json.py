"""Llama 3.1+ JSON tool calls: the message is `{"name": ..., "parameters": {...}}` (several separated
by ';'), optionally after the `<|python_tag|>` marker.

Example: '<|python_tag|>{"name": "weather", "parameters": {"city": "Oslo"}}' -> one call, no content.

Calls are read where the message starts with JSON (after whitespace or separators) or after the tag;
each is a call from its head on. Text after the calls is content again; a message that starts with
other JSON (`{"answer": 42}`) is content.
"""

from __future__ import annotations

from actors.http.tool_parsers.call_list import ListScanner

_PYTHON_TAG = "<|python_tag|>"
_LEADING = " \t\r\n;,"


class Llama3JsonScanner(ListScanner):
    openers = (_PYTHON_TAG,)

    def start(self, final: bool) -> bool:
        """A message that opens with JSON may be calls; its leading separators go with them."""
        pos = len(self.text) - len(self.text.lstrip(_LEADING))
        if pos == len(self.text) and not final:
            return False
        self.state = self.content
        if pos < len(self.text) and self.text[pos] == "{":
            self.enter_region(0, 0)
            self.pos, self.state = pos, self.call_object
        return True
