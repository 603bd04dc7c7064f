"""A tool answer's events as every protocol sends them (events.py), from a format's scanner:

- calls numbered in order (`index`), and with `parallel_tool_calls: false` only the first kept (the
  text of later ones is not content either);
- content held while all of it so far is whitespace: a message whose content is only whitespace has
  none (null), so that whitespace goes out only once something else follows it.

The whole answer is the same events collected (plan.py), so what streams is what the whole answer has.
"""

from __future__ import annotations

import dataclasses

from actors.http.tool_parsers.events import CallArguments, CallClosed, CallOpened, ContentText, ToolEvent
from actors.http.tool_parsers.scanner import Scanner


class ToolStream:
    def __init__(self, scanner: Scanner, parallel: bool = True) -> None:
        self.scanner, self.parallel = scanner, parallel
        self.num_calls = 0  # calls sent
        self._num_opened = 0  # calls the text opened, sent or not
        self._current: int | None = None  # the index of the call being read; None: not sent
        self._held = ""  # content so far, while it is only whitespace
        self._content_sent = False

    def feed(self, piece: str) -> list[ToolEvent]:
        """The events the answer's next text decides."""
        return self._published(self.scanner.feed(piece))

    def finish(self) -> list[ToolEvent]:
        """The rest, once the answer has ended (content that is only whitespace is dropped)."""
        return self._published(self.scanner.finish())

    def _published(self, events: list[ToolEvent]) -> list[ToolEvent]:
        published: list[ToolEvent] = []
        for event in events:
            if isinstance(event, ContentText):
                published += self._content(event.text)
            elif isinstance(event, CallOpened):
                self._current = self.num_calls if self.parallel or self._num_opened == 0 else None
                self._num_opened += 1
                if self._current is not None:
                    published.append(dataclasses.replace(event, index=self._current))
                    self.num_calls += 1
            elif self._current is not None:
                assert isinstance(event, CallArguments | CallClosed)
                published.append(dataclasses.replace(event, index=self._current))
        return published

    def _content(self, text: str) -> list[ToolEvent]:
        if self._content_sent:
            return [ContentText(text)]
        self._held += text
        if not self._held.strip():
            return []
        self._content_sent = True
        held, self._held = self._held, ""
        return [ContentText(held)]
