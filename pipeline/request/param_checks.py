"""Type and range checks for request parameters: every failure is a ValueError naming the field.

The messages are returned to clients as they are (`top_p must be in (0, 1], got 1.5`), so each
one names the field, the rule and the value. Values are never clamped into range.
"""

from __future__ import annotations

import math
import re
from typing import Any, NoReturn

from pipeline.request.untrusted import INT64_MAX, INT64_MIN

_TOKEN_ID_TEXT = re.compile(r"\s*[0-9]{1,18}\s*\Z")
# Sampling parameters become float32 tensor rows; a larger magnitude would turn into inf there.
FLOAT32_MAX = 3.4028234663852886e38


def fail(message: str) -> NoReturn:
    raise ValueError(message)


def check_bool(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        fail(f"{name} must be a bool, got {type(value).__name__} {value!r}")


def check_int(name: str, value: Any, *, optional: bool = False) -> None:
    if optional and value is None:
        return
    # bool is a subclass of int: `max_tokens=True` is a client bug, not 1.
    if not isinstance(value, int) or isinstance(value, bool):
        kind = "an int or None" if optional else "an int"
        fail(f"{name} must be {kind}, got {type(value).__name__} {value!r}")
    # Every int field becomes a C integer somewhere (a seed is an int64, counts index tensors).
    if not INT64_MIN <= value <= INT64_MAX:
        fail(f"{name} must be within the 64-bit signed range [{INT64_MIN}, {INT64_MAX}], got {value}")


def to_float(name: str, value: Any) -> float:
    if not isinstance(value, int | float) or isinstance(value, bool):
        fail(f"{name} must be a number, got {type(value).__name__} {value!r}")
    if not math.isfinite(value):
        fail(f"{name} must be finite, got {value!r}")
    if abs(value) > FLOAT32_MAX:
        fail(f"{name} must be at most {FLOAT32_MAX:.4g} in magnitude (a 32-bit float), got {value:g}")
    return float(value)


def check_range(name: str, value: float, low: float | None = None, high: float | None = None, *,
                low_open: bool = False, high_open: bool = False) -> None:
    """`value` in the interval; the message writes it the usual way: (0, 1], [0, 1000], >= 0, > 0."""
    too_low = low is not None and (value <= low if low_open else value < low)
    too_high = high is not None and (value >= high if high_open else value > high)
    if not (too_low or too_high):
        return
    if high is None:
        fail(f"{name} must be {'>' if low_open else '>='} {low:g}, got {value:g}")
    if low is None:
        fail(f"{name} must be {'<' if high_open else '<='} {high:g}, got {value:g}")
    left, right = "(" if low_open else "[", ")" if high_open else "]"
    fail(f"{name} must be in {left}{low:g}, {high:g}{right}, got {value:g}")


def normalize_strings(name: str, value: Any, *, allow_single: bool) -> tuple[str, ...]:
    """None, a string (when allowed) or a list of non-empty strings -> a tuple of strings."""
    if value is None:
        return ()
    items = (value,) if allow_single and isinstance(value, str) else value
    if not isinstance(items, list | tuple):
        kinds = "a string, a list of strings or None" if allow_single else "a list of strings"
        fail(f"{name} must be {kinds}, got {type(value).__name__}")
    for item in items:
        if not isinstance(item, str):
            fail(f"{name} must contain only strings, got {type(item).__name__} {item!r}")
        if not item:
            fail(f"{name} must not contain empty strings")
    return tuple(items)


def normalize_token_ids(name: str, value: Any) -> tuple[int, ...]:
    """None or a list of ids >= 0 -> a tuple (the vocabulary bound is checked at intake)."""
    if value is None:
        return ()
    if not isinstance(value, list | tuple):
        fail(f"{name} must be a list of ints, got {type(value).__name__}")
    for item in value:
        check_int(f"{name}[]", item)
        if item < 0:
            fail(f"{name} must be >= 0, got {item}")
    return tuple(value)


def normalize_logit_bias(value: Any, limit: float) -> tuple[tuple[int, float], ...]:
    """{token id: bias} -> ((id, bias), ...) sorted by id. JSON object keys are strings, so
    `{"50256": -100}` means token 50256 (OpenAI's form); msgpack may send int keys. The pair form
    is what the normalized params carry (and re-encode to) across actor edges."""
    if value is None:
        return ()
    if isinstance(value, dict):
        pairs = list(value.items())
    elif isinstance(value, list | tuple) and all(isinstance(p, list | tuple) and len(p) == 2 for p in value):
        pairs = list(value)
    else:
        fail(f"logit_bias must be a map of token id to bias, got {type(value).__name__}")
    biases: dict[int, float] = {}
    for key, bias in pairs:
        token_id = _token_id_key(key)
        number = to_float(f"logit_bias[{token_id}]", bias)
        check_range(f"logit_bias[{token_id}]", number, -limit, limit)
        biases[token_id] = number
    return tuple(sorted(biases.items()))


def _token_id_key(key: Any) -> int:
    # ASCII digits only: str.isdigit() also takes '²', which int() refuses; 19 digits fit an int64.
    if isinstance(key, str) and _TOKEN_ID_TEXT.match(key):
        key = int(key)
    if not isinstance(key, int) or isinstance(key, bool) or key < 0:
        fail(f"logit_bias keys must be token ids >= 0, got {key!r}")
    return key
