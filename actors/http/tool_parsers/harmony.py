"""gpt-oss (`--tool-call-parser openai`, vLLM's name): each call is a harmony message to a function,
`to=functions.NAME` in its header and the arguments' JSON as its body.

Example: 'Checking.<|start|>assistant<|channel|>commentary to=functions.weather <|constrain|>json<|message|>
{"city": "Oslo"}<|call|>' -> content 'Checking.', one call weather('{"city": "Oslo"}').

The markers are special tokens: this parser reads the content `--reasoning-parser gpt_oss` leaves,
which keeps a call's message whole, markers and all (actors/http/reasoning/harmony.py), and whose
requests keep special tokens in the text. A message is a call once its header names a function and its
body opens a JSON object; the body streams as it comes, up to the object's end, and a `<|call|>`,
`<|end|>` or `<|return|>` after it belongs to the call. `<|call|>` is a stop token, so it is usually
cut off. A message that is not to a function, or whose body is no object, stays content.
"""

from __future__ import annotations

import re
from typing import Literal

from actors.http.tool_parsers.json_head import read_value_start
from actors.http.tool_parsers.scanner import Scanner, State

OPENERS = ("<|start|>", "<|channel|>")
_MESSAGE = "<|message|>"
_IN_HEADER = ("<|channel|>", "<|constrain|>")
_ENDS = ("<|call|>", "<|end|>", "<|return|>")
_RECIPIENT = re.compile(r"\bto=functions\.([^\s<]+)")
_MAX_HEADER_CHARS = 1024


class HarmonyScanner(Scanner):
    openers = OPENERS
    argument_ends = _ENDS + OPENERS
    closers = _ENDS

    def __init__(self) -> None:
        super().__init__()
        self.function = ""  # the message's recipient, once its header is read

    def opened(self, marker: str) -> State:
        return self.header

    def header(self, final: bool) -> bool:
        """The header up to `<|message|>`: a call's when it names a function, else the message is content."""
        read = _header(self.text, self.resume, final)
        if read == "more":
            return False
        if read == "no":
            return self.fail()
        header, end = read
        recipient = _RECIPIENT.search(header)
        if recipient is None:
            self.resume = end
            return self.fail()
        self.function, self.pos, self.state = recipient[1], end, self.body
        return True

    def body(self, final: bool) -> bool:
        start = read_value_start(self.text, self.pos, final)
        if start == "more":
            return False
        if start == "no":
            self.resume = self.pos
            return self.fail()
        assert not isinstance(start, str)
        self.start_arguments(self.function, *start)
        return True


def _header(text: str, start: int, final: bool) -> tuple[str, int] | Literal["more", "no"]:
    """(the header from `start`, where its body begins) once `<|message|>` ends it; markers other than
    those a header holds end it as no message."""
    pos = start
    while (at := text.find("<", pos, start + _MAX_HEADER_CHARS)) >= 0:
        if text.startswith(_MESSAGE, at):
            return text[start:at], at + len(_MESSAGE)
        inner = next((marker for marker in _IN_HEADER if text.startswith(marker, at)), None)
        if inner is None:
            tail = text[at:at + max(map(len, (_MESSAGE, *_IN_HEADER)))]
            may_grow = any(len(tail) < len(marker) and marker.startswith(tail) for marker in (_MESSAGE, *_IN_HEADER))
            return "more" if may_grow and not final else "no"
        pos = at + len(inner)
    return "more" if len(text) - start < _MAX_HEADER_CHARS and not final else "no"
