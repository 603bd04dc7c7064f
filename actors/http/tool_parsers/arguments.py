"""A call's arguments read as they are generated: each read returns the characters that are surely
arguments, and whether the arguments are whole.

- `ObjectArguments`: a JSON object, passed on as written (as OpenAI returns arguments: the model's own
  text), up to its closing brace. Strings and nesting are followed, so a brace inside a string does not
  end it. Outside strings, a format's marker (`</tool_call>`, `<|call|>`, ...) ends arguments whose JSON
  never closed; a tail that may still become one is held, and so is a string's last backslash.
- `StringArguments`: a JSON string that holds the object (some models write `"arguments": "{\\"a\\": 1}"`),
  passed on decoded, escape by escape; an escape not whole yet is held.

Nothing here decides whether the text is a call: the head (json_head.py) did.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_IN_STRING = re.compile(r'[^"\\]*')
_PLAIN = re.compile(r'[^"{}\[\]]*')
_PLAIN_OR_MARKER = re.compile(r'[^"{}\[\]<]*')
_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
_UNICODE = re.compile(r"\\u([0-9a-fA-F]{4})")
Read = tuple[str, int, bool]  # (the arguments' next characters, where reading stopped, whether they are whole)


@dataclass(slots=True)
class ObjectArguments:
    ends: tuple[str, ...] = ()  # markers (each starting with "<") that end arguments outside a string
    depth: int = 0  # 1 to read the rest of an object whose opening brace was read already
    in_string: bool = False

    def read(self, text: str, pos: int, final: bool) -> Read:
        start = pos
        while pos < len(text):
            if self.in_string:
                pos = _IN_STRING.match(text, pos).end()  # type: ignore[union-attr]  # * always matches
                if pos < len(text) and text[pos] == '"':
                    self.in_string = False
                    pos += 1
                elif pos + 1 < len(text) or (pos < len(text) and final):
                    pos = min(pos + 2, len(text))  # an escape: the next character is the string's
                elif pos < len(text):
                    break  # a backslash whose escaped character has not come yet
                continue
            pos = (_PLAIN_OR_MARKER if self.ends else _PLAIN).match(text, pos).end()  # type: ignore[union-attr]
            if pos == len(text):
                break
            char = text[pos]
            if char == "<":
                if text.startswith(self.ends, pos):
                    return text[start:pos], pos, True
                if not final and _may_become(text, pos, self.ends):
                    break
            elif char == '"':
                self.in_string = True
            elif char in "{[":
                self.depth += 1
            else:
                self.depth -= 1
                if self.depth <= 0:
                    return text[start:pos + 1], pos + 1, True
            pos += 1
        return text[start:pos], pos, False


@dataclass(slots=True)
class StringArguments:
    opened: bool = False  # past the opening quote

    def read(self, text: str, pos: int, final: bool) -> Read:
        if not self.opened and pos < len(text):
            self.opened, pos = True, pos + 1
        decoded: list[str] = []
        while pos < len(text):
            run_end = _IN_STRING.match(text, pos).end()  # type: ignore[union-attr]  # * always matches
            decoded.append(text[pos:run_end])
            pos = run_end
            if pos == len(text):
                break
            if text[pos] == '"':
                return "".join(decoded), pos + 1, True
            escaped = _escape(text, pos, final)
            if escaped is None:
                break  # not whole yet
            decoded.append(escaped[0])
            pos = escaped[1]
        return "".join(decoded), pos, False


def _escape(text: str, pos: int, final: bool) -> tuple[str, int] | None:
    """The escape at `pos` decoded and where it ends; None while it may still grow. A lone surrogate
    becomes U+FFFD (it would not encode in the answer); an escape JSON does not have stays as written."""
    if pos + 1 == len(text):
        return ("\\", pos + 1) if final else None
    kind = text[pos + 1]
    if kind != "u":
        return _ESCAPES.get(kind, text[pos:pos + 2]), pos + 2
    first = _UNICODE.match(text, pos)
    if first is None:
        whole = final or len(text) - pos >= 6
        return (text[pos:pos + 2], pos + 2) if whole else None
    code = int(first[1], 16)
    if not 0xD800 <= code < 0xDC00:
        return (chr(code) if code < 0xD800 or code >= 0xE000 else "\ufffd"), first.end()
    second = _UNICODE.match(text, first.end())
    if second is None and not final and len(text) - first.end() < 6 and "\\u".startswith(text[first.end():][:2]):
        return None  # the low half may follow
    low = int(second[1], 16) if second is not None else 0
    if not 0xDC00 <= low < 0xE000:
        return "\ufffd", first.end()
    return chr(0x10000 + (code - 0xD800) * 0x400 + (low - 0xDC00)), second.end()  # type: ignore[union-attr]


def _may_become(text: str, pos: int, markers: tuple[str, ...]) -> bool:
    tail = text[pos:pos + max(map(len, markers))]
    return any(len(tail) < len(marker) and marker.startswith(tail) for marker in markers)
