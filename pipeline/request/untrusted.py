"""Checks on data from outside (HTTP bodies, batch-file lines, wire entries) before anything uses it.

Every path in takes its data through here once, so a value that would make some later stage raise
(a tokenizer, msgspec's encoder, torch, a C long) is refused at the edge with a message naming the
field, and the request is a 400 or an error reply instead of a crash somewhere downstream:

- text must be valid Unicode that encodes to UTF-8: JSON allows `"\\ud800"`, a lone surrogate,
  which no encoder accepts (the Rust tokenizer raises TypeError on it);
- integers must fit in int64 (no field means anything larger; torch and numpy overflow on them);
- floats must be finite (Python's json reads `NaN` and `Infinity`, which JSON does not have);
- nesting is at most MAX_NESTING deep (deeper data makes recursive code raise RecursionError);
- only JSON/msgpack's plain kinds: a msgpack extension type is refused wherever it appears.
"""

from __future__ import annotations

import json
from typing import Any

MAX_NESTING = 64  # lists and maps inside each other; a tool's JSON schema is far shallower
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


class UntrustedValueError(ValueError):
    """A value refused at the edge; `field` is the top-level field it sits in (OpenAI's `param`)."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


def loads_json(raw: bytes | str, what: str = "the body") -> Any:
    """JSON text -> a value that passed `check_untrusted`; UntrustedValueError says what is wrong."""
    try:
        value = json.loads(raw, parse_constant=_refuse_constant)
    except RecursionError:
        raise UntrustedValueError(f"{what} is nested more than {MAX_NESTING} levels deep") from None
    except UntrustedValueError:
        raise
    except ValueError as error:  # JSONDecodeError, bad UTF-8, an integer of thousands of digits
        raise UntrustedValueError(f"{what} is not valid JSON: {error}") from None
    check_untrusted(value)
    return value


def _refuse_constant(name: str) -> Any:
    raise UntrustedValueError(f"{name} is not a JSON number: numbers must be finite")


def check_untrusted(value: Any, root: str = "") -> None:
    """Walks `value` (iteratively: its depth is not trusted either) and raises UntrustedValueError
    naming the first bad item's path, e.g. `messages[0].content`; `root` prefixes the paths."""
    stack: list[tuple[Any, str, int]] = [(value, root, 0)]
    while stack:
        item, path, depth = stack.pop()
        if isinstance(item, str):
            check_text(item, path)
        elif item is None or isinstance(item, bool | bytes | bytearray):
            continue
        elif isinstance(item, int):
            check_int64(item, path)
        elif isinstance(item, float):
            if item != item or item in (float("inf"), float("-inf")):
                _fail(f"{_name(path)} must be a finite number, got {item!r}", path)
        elif isinstance(item, list | tuple | dict):
            if depth >= MAX_NESTING:
                _fail(f"{_name(path)} is nested more than {MAX_NESTING} levels deep", path)
            stack.extend(_children(item, path, depth + 1))
        else:
            _fail(f"{_name(path)} must be a string, number, bool, list or map, got {type(item).__name__}", path)


def check_text(text: str, path: str) -> None:
    """Valid Unicode: every code point encodes to UTF-8 (a lone surrogate does not)."""
    if text.isascii():
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        _fail(f"{_name(path)} is not valid Unicode: it holds a lone surrogate "
              f"{text[error.start]!r} at index {error.start}", path)


def check_int64(number: int, path: str) -> None:
    if not INT64_MIN <= number <= INT64_MAX:
        _fail(f"{_name(path)} must be within the 64-bit signed range [{INT64_MIN}, {INT64_MAX}], got {number}", path)


def _children(item: list | tuple | dict, path: str, depth: int) -> list[tuple[Any, str, int]]:
    if not isinstance(item, dict):
        return [(child, f"{path}[{index}]", depth) for index, child in enumerate(item)]
    children = []
    for key, child in item.items():
        if isinstance(key, str):
            check_text(key, f"{path} keys")
        elif isinstance(key, int) and not isinstance(key, bool):  # msgpack maps may have int keys
            check_int64(key, f"{path} keys")
        else:
            _fail(f"{_name(path)} keys must be strings, got {type(key).__name__}", path)
        children.append((child, f"{path}.{key}" if path else str(key), depth))
    return children


def _name(path: str) -> str:
    return path or "the value"


def _fail(message: str, path: str) -> None:
    top = path.split(".", 1)[0].split("[", 1)[0].split(" ", 1)[0]
    raise UntrustedValueError(message, top or None)
