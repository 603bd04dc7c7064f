"""One answer's text -> its reasoning and its content, piece by piece as the text streams in.

    "<think>I shall add.</think>4"  ->  reasoning "I shall add.", content "4"

Each piece goes out as soon as nothing that may follow can change where it belongs: while the answer
may still open with the start marker (whitespace, `<thi`) it is held, and so is a tail of the reasoning
that may still grow into the end marker (`</th`). A marker cut across pieces is therefore found
whole, and a whole answer is split by the same machine fed once (`split_whole`), so the streamed
pieces always reassemble to the whole answer's split. gpt-oss's harmony messages go through the same
interface to their own machine (harmony.py), held back by the same rule.
"""

from __future__ import annotations

from enum import Enum

from actors.http.reasoning.formats import ReasoningFormat
from actors.http.reasoning.harmony import HarmonySplitter
from actors.http.reasoning.split import Split

__all__ = ["ReasoningSplitter", "Split", "split_whole"]


class _Phase(Enum):
    OPENING = "opening"  # not yet known whether the answer opens with the start marker
    REASONING = "reasoning"
    CONTENT = "content"


class ReasoningSplitter:
    def __init__(self, fmt: ReasoningFormat) -> None:
        self.fmt = fmt
        self._phase = _Phase.CONTENT if fmt.opening == "never" else _Phase.OPENING
        self._held = ""  # text received and not yet given out
        # gpt_oss: channels of harmony messages, not a pair of markers (harmony.py)
        self._harmony = HarmonySplitter(fmt.opening != "never") if fmt.syntax == "harmony" else None

    def feed(self, text: str) -> Split:
        """The parts of the text so far that are sure now."""
        if self._harmony is not None:
            return self._harmony.feed(text)
        return self._advance(self._held + text, final=False)

    def finish(self) -> Split:
        """The rest, at the answer's end: a held tail belongs where the answer was (no end marker:
        the reasoning was cut short, and it is all reasoning)."""
        if self._harmony is not None:
            return self._harmony.finish()
        return self._advance(self._held, final=True)

    def _advance(self, text: str, final: bool) -> Split:
        self._held = ""
        if self._phase is _Phase.OPENING:
            text = self._open(text, final)
            if self._phase is _Phase.OPENING:
                return Split()
        if self._phase is _Phase.CONTENT:
            return Split(content=text)
        found = text.find(self.fmt.end)
        if found < 0:
            keep = 0 if final else _partial_marker(text, self.fmt.end)
            self._held = text[len(text) - keep:]
            return Split(reasoning=text[:len(text) - keep])
        self._phase = _Phase.CONTENT
        return Split(reasoning=text[:found], content=text[found + len(self.fmt.end):])

    def _open(self, text: str, final: bool) -> str:
        """Decides the phase from the answer's start when it can; returns the text past the start marker."""
        stripped = text.lstrip()
        if stripped.startswith(self.fmt.start):
            self._phase = _Phase.REASONING
            return stripped[len(self.fmt.start):]
        if not final and self.fmt.start.startswith(stripped):  # whitespace, or a marker's beginning
            self._held = text
            return ""
        self._phase = _Phase.REASONING if self.fmt.opening == "prompt" else _Phase.CONTENT
        return text


def _partial_marker(text: str, marker: str) -> int:
    """The length of the longest tail of `text` that is a proper beginning of `marker` (0: none)."""
    for length in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-length:]):
            return length
    return 0


def split_whole(fmt: ReasoningFormat, text: str) -> tuple[str | None, str | None]:
    """A finished answer's (reasoning, content), each None when empty."""
    splitter = ReasoningSplitter(fmt)
    split = splitter.feed(text) + splitter.finish()
    return split.reasoning or None, split.content or None
