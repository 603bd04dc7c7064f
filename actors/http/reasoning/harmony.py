"""gpt-oss's harmony answers -> reasoning and content, piece by piece as the text streams in.

After the prompt's `<|start|>assistant` the answer is a sequence of messages, each a header, a body
and an end (`<|end|>`; `<|return|>` or `<|call|>` last, usually cut by the stop tokens):

    <|channel|>analysis<|message|>I add.<|end|><|start|>assistant<|channel|>final<|message|>4<|return|>
    ->  reasoning "I add.", content "4"

- an `analysis` body is reasoning; a `final` one is content, and so is a `commentary` one (a preamble,
  which the user sees);
- a message to a function (` to=functions.NAME` in its header) is a tool call: it goes to the content
  whole, markers and all, where `--tool-call-parser openai` reads it (without it the call stays in the
  content, as any format's call does without its parser);
- the markers and the headers are not text and go nowhere, nor does a header the answer's end cuts off;
- text after a message's end that no header follows goes where that message went: an answer cut off
  after its analysis is reasoning to its end;
- an answer that does not open with `<|channel|>` or `<|start|>` is not harmony: all content, as written.

Each piece goes out as soon as it is sure: only a tail that may still grow into a marker (`<|`,
`<|chan`) is held, and a header until its `<|message|>` says where the body goes; so the streamed
pieces reassemble to the whole answer's split. The markers are special tokens: the gateway asks for
them in the text (formats.decode_params).
"""

from __future__ import annotations

import re
from enum import Enum

from actors.http.reasoning.split import Split

OPENERS = ("<|start|>", "<|channel|>")
ENDS = ("<|end|>", "<|return|>", "<|call|>")
MARKERS = (*OPENERS, "<|constrain|>", "<|message|>", *ENDS)
_MARKER = re.compile("|".join(re.escape(marker) for marker in MARKERS))
_CHANNEL = re.compile(r"<\|channel\|>\s*([^\s<]+)")
_RECIPIENT = re.compile(r"\bto=([^\s<]+)")


class _Where(Enum):
    REASONING = "reasoning"
    CONTENT = "content"
    CALL = "call"  # content, markers and all


class HarmonySplitter:
    def __init__(self, harmony: bool = True) -> None:
        """`harmony` False: every answer is all content (thinking switched off)."""
        self._opening = harmony  # not yet known whether the answer is harmony
        self._plain = not harmony
        self._header: str | None = None  # a message's header so far, while in one
        self._where = _Where.CONTENT  # where the current body goes
        self._held = ""  # text received and not yet given out

    def feed(self, text: str) -> Split:
        """The parts of the text so far that are sure now."""
        return self._advance(self._held + text, final=False)

    def finish(self) -> Split:
        """The rest, at the answer's end."""
        return self._advance(self._held, final=True)

    def _advance(self, text: str, final: bool) -> Split:
        self._held = ""
        if self._opening:
            if not final and any(opener.startswith(text) for opener in OPENERS):
                self._held = text
                return Split()
            self._opening, self._plain = False, not text.startswith(OPENERS)
        if self._plain:
            return Split(content=text)
        sure = len(text) - (0 if final else partial_marker(text))
        self._held = text[sure:]
        split, position = Split(), 0
        for match in _MARKER.finditer(text, 0, sure):
            split += self._text(text[position:match.start()]) + self._marker(match.group())
            position = match.end()
        split += self._text(text[position:sure])
        if final:
            self._header = None
        return split

    def _text(self, text: str) -> Split:
        if self._header is not None:
            self._header += text
            return Split()
        return Split(reasoning=text) if self._where is _Where.REASONING else Split(content=text)

    def _marker(self, marker: str) -> Split:
        if marker == "<|start|>" or (marker == "<|channel|>" and self._header is None):
            self._header = marker  # a new message (one whose header was cut short is dropped)
            return Split()
        if self._header is None:  # a marker inside a body: text only in a call's
            return Split(content=marker) if self._where is _Where.CALL else Split()
        if marker in ENDS:  # a header that never got its body
            self._header = None
            return Split()
        if marker != "<|message|>":
            self._header += marker
            return Split()
        header, self._header = self._header + marker, None
        self._where = destination(header)
        return Split(content=header) if self._where is _Where.CALL else Split()


def destination(header: str) -> _Where:
    """Where a message's body goes, by its header (`<|channel|>commentary to=functions.f <|constrain|>json`)."""
    recipient = _RECIPIENT.search(header)
    if recipient is not None and recipient[1].startswith("functions."):
        return _Where.CALL
    channel = _CHANNEL.search(header)
    return _Where.REASONING if channel is not None and channel[1] == "analysis" else _Where.CONTENT


def partial_marker(text: str) -> int:
    """The length of the longest tail of `text` that is a proper beginning of a marker (0: none)."""
    for length in range(min(max(map(len, MARKERS)) - 1, len(text)), 0, -1):
        if any(marker.startswith(text[-length:]) for marker in MARKERS):
            return length
    return 0
