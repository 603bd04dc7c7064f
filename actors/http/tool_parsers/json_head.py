"""The head of a call written as JSON, read as it comes: `{"name": "weather", "arguments": ` up to the
first characters of the arguments, which say they are an object (`{` then `"` or `}`) or a JSON string
that holds one (`"`). Once the head is whole the call is one, whatever follows: its arguments stream as
they are generated (arguments.py). Until then the text may still turn out to be content.

    read_call_head('{"name": "weather", "arguments": {"ci', 0, final=False)
        -> Head(name="weather", value_at=33, is_string=False)
    read_call_head('{"name": "wea', 0, final=False) -> "more"      (final: "no")
    read_call_head('{"answer": 42}', 0, final=False) -> "no"

The name comes first, as Hermes, Mistral, Llama 3 and the `required` constraint write it; its key is
`name`, the arguments' `arguments` or `parameters`. `{"name": "f"}` is a call without arguments ({}).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Literal

from pipeline.request.tools import MAX_NAME_CHARS

_WHITESPACE = re.compile(r"[ \t\r\n]*")
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_ARGUMENT_KEYS = ('"arguments"', '"parameters"')
Undecided = Literal["more", "no"]  # more: the text so far may still become a head; no: it cannot


class _More(Exception):
    pass


class _No(Exception):
    pass


@dataclass(frozen=True, slots=True)
class Head:
    name: str
    value_at: int | None  # where the arguments begin; None: the object closed without any
    end: int  # where the text after the head begins (value_at, or past the closing brace)
    is_string: bool = False  # the arguments are a JSON string (that holds the object)


def read_call_head(text: str, pos: int, final: bool) -> Head | Undecided:
    """The head of a call starting at `pos` (after whitespace); `final`: no more text will come."""
    try:
        return _head(text, pos)
    except _More:
        return "no" if final else "more"
    except _No:
        return "no"


def read_value_start(text: str, pos: int, final: bool) -> tuple[int, bool] | Undecided:
    """(where the arguments begin, whether they are a string) for arguments starting at `pos`."""
    try:
        return _value(text, skip_whitespace(text, pos))
    except _More:
        return "no" if final else "more"
    except _No:
        return "no"


def skip_whitespace(text: str, pos: int) -> int:
    match = _WHITESPACE.match(text, pos)
    assert match is not None  # * matches the empty string
    return match.end()


def _head(text: str, pos: int) -> Head:
    pos = _literal(text, skip_whitespace(text, pos), ("{",))
    pos = _literal(text, skip_whitespace(text, pos), ('"name"',))
    pos = _literal(text, skip_whitespace(text, pos), (":",))
    name, pos = _name(text, skip_whitespace(text, pos))
    pos = skip_whitespace(text, pos)
    if _char(text, pos) == "}":
        return Head(name, None, pos + 1)
    pos = _literal(text, pos, (",",))
    pos = _literal(text, skip_whitespace(text, pos), _ARGUMENT_KEYS)
    pos = _literal(text, skip_whitespace(text, pos), (":",))
    value_at, is_string = _value(text, skip_whitespace(text, pos))
    return Head(name, value_at, value_at, is_string)


def _value(text: str, pos: int) -> tuple[int, bool]:
    char = _char(text, pos)
    if char == '"':
        return pos, True
    if char != "{" or _char(text, skip_whitespace(text, pos + 1)) not in ('"', "}"):
        raise _No
    return pos, False


def _char(text: str, pos: int) -> str:
    if pos >= len(text):
        raise _More
    return text[pos]


def _literal(text: str, pos: int, options: tuple[str, ...]) -> int:
    for option in options:
        if text.startswith(option, pos):
            return pos + len(option)
    rest = text[pos:pos + max(map(len, options))]
    if any(len(rest) < len(option) and option.startswith(rest) for option in options):
        raise _More
    raise _No


def _name(text: str, pos: int) -> tuple[str, int]:
    if _char(text, pos) != '"':
        raise _No
    match = _STRING.match(text, pos)
    if match is None:
        if len(text) - pos > 6 * MAX_NAME_CHARS + 2:  # longer than any name, escaped
            raise _No
        raise _More
    try:
        name = json.loads(match[0])
        name.encode()  # a lone surrogate escape (\ud800) is no name: it would not encode in the answer
    except (ValueError, UnicodeEncodeError):
        raise _No from None
    if not name or len(name) > MAX_NAME_CHARS:
        raise _No
    return name, match.end()
