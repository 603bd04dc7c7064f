"""Calls one after another in JSON, as Mistral, Llama 3 and the `required` constraint write them:
`[{"name": ..., "arguments": {...}}, {...}]` or `{...}; {...}`. Each item is a call from its head on
(scanner.py); after its arguments the rest of its object is dropped, then separators, and the next
call, the list's end or other text (content again).
"""

from __future__ import annotations

from actors.http.tool_parsers.json_head import skip_whitespace
from actors.http.tool_parsers.scanner import Scanner

_SEPARATORS = " \t\r\n,;"


class ListScanner(Scanner):
    """Calls one after another in JSON (`[{...}, {...}]`, `{...}; {...}`): after a call's arguments the
    rest of its object (dropped), then separators and the next call, the list's end or other text."""

    def __init__(self) -> None:
        super().__init__()
        self.in_list = False  # inside brackets: a "]" ends the calls

    def after_object(self, final: bool) -> bool:
        self.state = self.between_items
        return True

    def between_items(self, final: bool) -> bool:
        """Separators after a call in a list; then the next call, the list's end, or other text."""
        pos = self.pos
        while pos < len(self.text) and self.text[pos] in _SEPARATORS:
            pos += 1
        moved, self.pos = pos != self.pos, pos
        if pos == len(self.text):
            return moved
        if self.text[pos] == "{":
            self.enter_region(pos, pos)
            self.state = self.call_object
        else:
            if self.text[pos] == "]" and self.in_list:
                self.pos += 1  # the list's end, read with it
            self.in_list, self.state = False, self.after_list
        return True

    def after_list(self, final: bool) -> bool:
        self.state = self.content
        return True

    def list_start(self, final: bool) -> bool:
        """A list of calls (`[` optional): its first call's head comes next."""
        pos = skip_whitespace(self.text, self.pos)
        if pos == len(self.text):
            return self.fail() if final else False
        if self.text[pos] == "[":
            self.in_list, pos = True, pos + 1
        self.pos, self.state = pos, self.call_object
        return True
