"""A constrained tool answer (tool_choice.py's constraint) scanned as the auto formats are:

- `required`: a JSON list of {"name", "parameters"} objects; each item is a call from its head on, its
  arguments streamed as they come. An answer cut before its first call is content (it cannot parse);
  one cut inside a later call's head keeps the calls before it.
- a named function: the answer is the function's arguments, as generated (also when max_tokens cut
  them, as vLLM answers): the call opens at once and every piece adds to its arguments.
"""

from __future__ import annotations

from actors.http.tool_parsers.call_list import ListScanner
from actors.http.tool_parsers.events import CallArguments
from actors.http.tool_parsers.scanner import Scanner


class RequiredScanner(ListScanner):
    def start(self, final: bool) -> bool:
        self.enter_region(0, 0)
        self.state = self.list_start
        return True

    def fail(self) -> bool:
        if self.anchor == 0:
            return super().fail()
        self.state = self.drop  # a later item cut short: the calls before it stand
        return True

    def after_list(self, final: bool) -> bool:
        self.state = self.drop
        return True

    def drop(self, final: bool) -> bool:
        moved, self.pos = self.pos < len(self.text), len(self.text)
        return moved


class NamedScanner(Scanner):
    def __init__(self, function: str) -> None:
        super().__init__()
        self.function = function

    def start(self, final: bool) -> bool:
        self.open_call(self.function)
        self.state = self.whole_text
        return True

    def whole_text(self, final: bool) -> bool:
        if self.pos == len(self.text):
            return False
        self.emit(CallArguments(self.text[self.pos:]))
        self.pos = len(self.text)
        return True
