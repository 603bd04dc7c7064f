"""The cursor a tool-call format's scanner moves over an answer's text as it comes, and the states the
formats share. A scanner emits events (events.py) as soon as the text decides them, and holds back only
what may still turn out otherwise: a tail that may be the start of a marker, a call's head until it is
whole (json_head.py), and what arguments.py holds. It never holds a whole call: once a call's head is
read, the call is one, and its arguments stream as they come.

States, each a method that reads from `pos` and says whether it moved (`final`: no more text comes, so
each state decides with what there is):

    content       text up to an opener (a format's marker), then the state `opened` names
    call_object   a JSON call's head: a call, or back to content from `resume` (`fail`)
    arguments     the call's arguments (arguments.py), then `after_arguments`
    object_rest   the rest of the call's object, dropped; then close_call: a closer (`</tool_call>`),
                  read with the call, or content again
    (call_list.py: calls in a JSON list or sequence, `[{...}, {...}]`)

A region that turns out not to be a call becomes content from its `anchor` (its first character), so
text that only looks like a call stays content. The same text gives the same events however it is cut.
"""

from __future__ import annotations

from collections.abc import Callable

from actors.http.tool_parsers.arguments import ObjectArguments, StringArguments
from actors.http.tool_parsers.base import new_call_id
from actors.http.tool_parsers.events import CallArguments, CallClosed, CallOpened, ContentText, ToolEvent
from actors.http.tool_parsers.json_head import read_call_head, skip_whitespace

State = Callable[[bool], bool]
_TRIM_AT = 4096  # characters read and done with, dropped from the buffer


class Scanner:
    openers: tuple[str, ...] = ()  # markers that may open calls in content
    argument_ends: tuple[str, ...] = ()  # markers that end unclosed arguments (outside a JSON string)
    closers: tuple[str, ...] = ()  # markers that end a call's region, read with it

    def __init__(self) -> None:
        self.text = ""
        self.pos = 0
        self.anchor: int | None = None  # the first character of the region being read, until it is a call
        self.resume = 0  # where content goes on from when that region is not a call
        self.reader: ObjectArguments | StringArguments | None = None
        self.state: State = self.start
        self._events: list[ToolEvent] = []

    def feed(self, piece: str) -> list[ToolEvent]:
        """The events the answer's next text decides."""
        self.text += piece
        return self._run(final=False)

    def finish(self) -> list[ToolEvent]:
        """The rest, once the answer has ended."""
        return self._run(final=True)

    def _run(self, final: bool) -> list[ToolEvent]:
        while self.state(final):
            pass
        events, self._events = self._events, []
        self._trim()
        return events

    # ---- states ---------------------------------------------------------------------------------

    def start(self, final: bool) -> bool:
        self.state = self.content
        return True

    def content(self, final: bool) -> bool:
        found = first_marker(self.text, self.pos, self.openers)
        if found is None:
            end = len(self.text) if final else len(self.text) - partial_marker(self.text, self.pos, self.openers)
            return self._content_to(end)
        at, marker = found
        self._content_to(at)
        self.enter_region(at, at + len(marker))
        self.state = self.opened(marker)
        return True

    def opened(self, marker: str) -> State:
        """The state after an opener."""
        return self.call_object

    def call_object(self, final: bool) -> bool:
        head = read_call_head(self.text, self.pos, final)
        if head == "more":
            return False
        if head == "no":
            return self.fail()
        assert not isinstance(head, str)
        if head.value_at is None:
            self.open_call(head.name)
            self.emit(CallArguments("{}"))
            self.emit(CallClosed())
            self.pos, self.state = head.end, self.after_object
        else:
            self.start_arguments(head.name, head.value_at, head.is_string)
        return True

    def arguments(self, final: bool) -> bool:
        assert self.reader is not None
        piece, pos, whole = self.reader.read(self.text, self.pos, final)
        moved, self.pos = pos != self.pos, pos
        if piece:
            self.emit(CallArguments(piece))
        if whole:
            self.emit(CallClosed())
            self.state = self.after_arguments
        return moved or whole

    def after_arguments(self, final: bool) -> bool:
        """Arguments whose JSON a marker cut short leave no object to finish; others, the rest of it."""
        cut_short = isinstance(self.reader, ObjectArguments) and self.reader.depth > 0
        self.reader = None
        self.state = self.after_object if cut_short else self.object_rest
        return True

    def object_rest(self, final: bool) -> bool:
        """The call object after its arguments (a key the call does not use, its closing brace): dropped."""
        if self.reader is None:
            self.reader = ObjectArguments(self.argument_ends, depth=1)
        _, pos, whole = self.reader.read(self.text, self.pos, final)
        moved, self.pos = pos != self.pos, pos
        if whole:
            self.reader, self.state = None, self.after_object
        return moved or whole

    def after_object(self, final: bool) -> bool:
        self.state = self.close_call
        return True

    def close_call(self, final: bool) -> bool:
        """A closer after the call object (and whitespace) is the call's; any other text is content."""
        pos = skip_whitespace(self.text, self.pos)
        closer = next((marker for marker in self.closers if self.text.startswith(marker, pos)), None)
        if closer is None and not final and (pos == len(self.text) or partial_marker(
                self.text, pos, self.closers) == len(self.text) - pos):
            return False  # whitespace, or a closer's start, so far
        self.pos = pos + len(closer) if closer is not None else self.pos
        self.state = self.content
        return True

    # ---- actions --------------------------------------------------------------------------------

    def fail(self) -> bool:
        """The region is not a call: content from its anchor on."""
        assert self.anchor is not None
        if self.resume > self.anchor:
            self.emit(ContentText(self.text[self.anchor:self.resume]))
        self.pos, self.anchor, self.state = self.resume, None, self.content
        return True

    def enter_region(self, anchor: int, resume: int) -> None:
        self.anchor, self.resume, self.pos = anchor, resume, resume

    def open_call(self, name: str) -> None:
        self.emit(CallOpened(name, self.new_id()))
        self.anchor = None

    def start_arguments(self, name: str, value_at: int, is_string: bool) -> None:
        self.open_call(name)
        self.reader = StringArguments() if is_string else ObjectArguments(self.argument_ends)
        self.pos, self.state = value_at, self.arguments

    def new_id(self) -> str:
        return new_call_id()

    def emit(self, event: ToolEvent) -> None:
        self._events.append(event)

    def _content_to(self, end: int) -> bool:
        if end <= self.pos:
            return False
        self.emit(ContentText(self.text[self.pos:end]))
        self.pos = end
        return True

    def _trim(self) -> None:
        keep = self.pos if self.anchor is None else min(self.pos, self.anchor)
        if keep < _TRIM_AT:
            return
        self.text, self.pos, self.resume = self.text[keep:], self.pos - keep, max(self.resume - keep, 0)
        if self.anchor is not None:
            self.anchor -= keep


def first_marker(text: str, pos: int, markers: tuple[str, ...]) -> tuple[int, str] | None:
    """The first of `markers` in `text` from `pos`: (where, which)."""
    found = [(at, marker) for marker in markers if (at := text.find(marker, pos)) >= 0]
    return min(found) if found else None


def partial_marker(text: str, pos: int, markers: tuple[str, ...]) -> int:
    """How many of the text's last characters (from `pos` on) may be the start of one of `markers`."""
    longest = 0
    for marker in markers:
        for length in range(min(len(marker) - 1, len(text) - pos), longest, -1):
            if text.endswith(marker[:length]):
                longest = length
                break
    return longest
