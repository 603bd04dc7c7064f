"""The shortest text that completes a prefix of a JSON document, for closing a constrained JSON
answer before its token budget runs out (pipeline/scheduling/grammar_masks.py).

A small model sampled at temperature 1 under a JSON grammar may write ever more keys or an endless
string until max_tokens, and an answer cut there is not JSON at all. The scheduler instead lets it
write freely until the budget holds just the closing text, then allows only that: the answer keeps
every token the model chose and ends as valid JSON.

Examples (prefix -> suffix):
    {"a": [1, 2            ->  ]}
    {"name": "Al           ->  "}
    {"name                 ->  ":null}
    {"a":                  ->  null}
    {"a": 1,               ->  "":null}
    [tr                    ->  ue]
    {"n": -                ->  0}
    {"s": "x\\             ->  n"}
None for text that is not a JSON prefix this reader follows (it is the grammar's to allow).
"""

from __future__ import annotations

from dataclasses import dataclass, field

_LITERALS = ("true", "false", "null")
_WHITESPACE = " \t\n\r"


@dataclass
class _Reader:
    """Where a JSON prefix stands: open containers and what the innermost one expects next."""
    stack: list[str] = field(default_factory=list)  # "{" or "["
    expect: str = "value"  # value | key | colon | comma_or_end | key_or_end | value_or_end | done
    in_string: bool = False
    string_is_key: bool = False
    escape: int = 0  # 0: none; 1: after a backslash; 2..5: hex digits of \\u still wanted (5 - escape + 1)
    number: str = ""  # the number being written
    literal: str = ""  # the literal being written (a prefix of true / false / null)

    def feed(self, text: str) -> bool:
        return all(self._char(char) for char in text)

    def _char(self, char: str) -> bool:
        if self.in_string:
            return self._string_char(char)
        if self.literal:
            return self._literal_char(char)
        if self.number:
            if char in "0123456789+-.eE":
                self.number += char
                return True
            self._end_value()
        return self._structural(char)

    def _string_char(self, char: str) -> bool:
        if self.escape == 1:
            self.escape = 2 if char == "u" else 0
            return char in '"\\/bfnrtu'
        if self.escape >= 2:
            if char not in "0123456789abcdefABCDEF":
                return False
            self.escape = 0 if self.escape == 5 else self.escape + 1
            return True
        if char == "\\":
            self.escape = 1
        elif char == '"':
            self.in_string = False
            if self.string_is_key:
                self.expect = "colon"
            else:
                self._end_value()
        return True

    def _literal_char(self, char: str) -> bool:
        candidate = self.literal + char
        if not any(word.startswith(candidate) for word in _LITERALS):
            return False
        self.literal = candidate
        if candidate in _LITERALS:
            self.literal = ""
            self._end_value()
        return True

    def _structural(self, char: str) -> bool:
        if char in _WHITESPACE:
            return True
        expect = self.expect
        if char in "}]" and expect in ("comma_or_end", "key_or_end", "value_or_end"):
            return self._close(char)
        if char == "," and expect == "comma_or_end":
            self.expect = "key" if self.stack[-1] == "{" else "value"
            return True
        if char == ":" and expect == "colon":
            self.expect = "value"
            return True
        if char == '"' and expect in ("key", "key_or_end"):
            self.in_string, self.string_is_key = True, True
            return True
        if expect in ("value", "value_or_end"):
            return self._start_value(char)
        return False

    def _start_value(self, char: str) -> bool:
        if char in "{[":
            self.stack.append(char)
            self.expect = "key_or_end" if char == "{" else "value_or_end"
        elif char == '"':
            self.in_string, self.string_is_key = True, False
        elif char in "-0123456789":
            self.number = char
        elif any(word.startswith(char) for word in _LITERALS):
            self.literal = char
        else:
            return False
        return True

    def _close(self, char: str) -> bool:
        if not self.stack or "{[".index(self.stack[-1]) != "}]".index(char):
            return False
        self.stack.pop()
        self._end_value()
        return True

    def _end_value(self) -> None:
        self.number = ""
        self.expect = "comma_or_end" if self.stack else "done"

    def suffix(self) -> str:
        """What completes the document from here."""
        text = ""
        if self.in_string:
            text += ("n" if self.escape == 1 else "0" * (6 - self.escape) if self.escape else "") + '"'
            text += ":null" if self.string_is_key else ""
        elif self.literal:
            text += next(word for word in _LITERALS if word.startswith(self.literal))[len(self.literal):]
        elif self.number:
            text += _number_ending(self.number)
        elif self.expect == "colon":
            text += ":null"
        elif self.expect == "value":
            text += "null"
        elif self.expect == "key":
            text += '"":null'
        return text + "".join("}" if opener == "{" else "]" for opener in reversed(self.stack))


def _number_ending(number: str) -> str:
    """Digits a number prefix needs to be a number: '-' -> '0', '1.' -> '0', '2e' / '2e-' -> '0'."""
    return "0" if number[-1] in "-+.eE" else ""


def closing_suffix(prefix: str) -> str | None:
    """The shortest text after `prefix` that makes one JSON value of it; None when `prefix` is not a
    JSON prefix or is already complete (nothing to close)."""
    reader = _Reader()
    if not reader.feed(prefix) or (reader.expect == "done" and not reader.number):
        return None
    if reader.expect == "value" and not reader.stack and not reader.in_string and not reader.literal \
            and not reader.number:
        return None  # nothing written yet: the model has its whole budget's say
    return reader.suffix()
