"""SamplingParams: the per-request sampling knobs, with OpenAI/vLLM names, defaults and validation.

Every error is a ValueError that names the field and the rule (`max_tokens must be >= 1, got 0`),
including type errors, so the gateway can return them to the client as they are. `from_dict`
rejects unknown keys: a typo such as `temprature` must fail loudly, never sample at T=1.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, fields
from typing import Any, NamedTuple, NoReturn

MAX_LOGPROBS = 20
MAX_N = 128  # choices per request: each is a sequence with its own KV blocks
# Below this temperature logits / T overflows float32 for ordinary logits; such requests are
# greedy (as in vLLM), which is also what the user meant.
GREEDY_TEMPERATURE = 1e-5


class SamplingType(enum.IntEnum):
    GREEDY = 0
    RANDOM = 1  # always seeded: an explicit seed or one derived from the request id (DESIGN §5)


class SamplingRowValues(NamedTuple):
    """One request's values for the SamplingBatch columns; neutral values where a knob is off."""

    temperature: float  # 0 = greedy
    top_p: float  # 1 = off
    top_k: int  # 0 = off
    min_p: float  # 0 = off
    presence_penalty: float
    frequency_penalty: float
    repetition_penalty: float
    num_logprobs: int  # -1 = none


def _fail(message: str) -> NoReturn:
    raise ValueError(message)


def _check_bool(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        _fail(f"{name} must be a bool, got {type(value).__name__} {value!r}")


def _check_int(name: str, value: Any, *, optional: bool = False) -> None:
    if optional and value is None:
        return
    # bool is a subclass of int: `max_tokens=True` is a client bug, not 1.
    if not isinstance(value, int) or isinstance(value, bool):
        kind = "an int or None" if optional else "an int"
        _fail(f"{name} must be {kind}, got {type(value).__name__} {value!r}")


def _to_float(name: str, value: Any) -> float:
    if not isinstance(value, int | float) or isinstance(value, bool):
        _fail(f"{name} must be a number, got {type(value).__name__} {value!r}")
    if not math.isfinite(value):
        _fail(f"{name} must be finite, got {value!r}")
    return float(value)


def _normalize_stop(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    items = (value,) if isinstance(value, str) else value
    if not isinstance(items, list | tuple):
        _fail(f"stop must be a string, a list of strings or None, got {type(value).__name__}")
    for item in items:
        if not isinstance(item, str):
            _fail(f"stop must contain only strings, got {type(item).__name__} {item!r}")
        if not item:
            _fail("stop must not contain empty strings")
    return tuple(items)


def _normalize_stop_token_ids(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if not isinstance(value, list | tuple):
        _fail(f"stop_token_ids must be a list of ints, got {type(value).__name__}")
    for item in value:
        _check_int("stop_token_ids[]", item)
        if item < 0:
            _fail(f"stop_token_ids must be >= 0, got {item}")
    return tuple(value)


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """Sampling parameters of one request; `stop` and `stop_token_ids` become tuples."""

    n: int = 1
    best_of: int | None = None  # None or n; normalized to n
    max_tokens: int | None = 16  # None = until max_model_len
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1 = off; normalized to 0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None  # None = derived from the request id (pipeline.rng.request_seed)
    # Annotated with the normalized types; construction also accepts a str, a list or None.
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    min_tokens: int = 0
    logprobs: int | None = None  # None = none; k = chosen token + top-k alternatives
    prompt_logprobs: int | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True

    def __post_init__(self) -> None:
        self._check_types()
        self._check_counts()
        self._check_ranges()

    def _set(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)  # frozen: normalization happens only here

    def _check_types(self) -> None:
        for name in ("n", "min_tokens", "top_k"):
            _check_int(name, getattr(self, name))
        for name in ("best_of", "max_tokens", "seed", "logprobs", "prompt_logprobs"):
            _check_int(name, getattr(self, name), optional=True)
        for name in ("ignore_eos", "include_stop_str_in_output", "skip_special_tokens"):
            _check_bool(name, getattr(self, name))
        for name in ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty",
                     "repetition_penalty"):
            self._set(name, _to_float(name, getattr(self, name)))
        self._set("stop", _normalize_stop(self.stop))
        self._set("stop_token_ids", _normalize_stop_token_ids(self.stop_token_ids))

    def _check_counts(self) -> None:
        if not 1 <= self.n <= MAX_N:
            _fail(f"n must be in [1, {MAX_N}], got {self.n}")
        if self.best_of is not None and self.best_of != self.n:
            _fail(f"best_of must be None or equal to n ({self.n}), got {self.best_of}: "
                  "best_of > n is not supported yet")
        self._set("best_of", self.n)
        if self.max_tokens is not None and self.max_tokens < 1:
            _fail(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.min_tokens < 0:
            _fail(f"min_tokens must be >= 0, got {self.min_tokens}")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            _fail(f"min_tokens must be <= max_tokens ({self.max_tokens}), got {self.min_tokens}")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and not 0 <= value <= MAX_LOGPROBS:
                _fail(f"{name} must be in [0, {MAX_LOGPROBS}] or None, got {value}")

    def _check_ranges(self) -> None:
        if self.temperature < 0:
            _fail(f"temperature must be >= 0, got {self.temperature:g}")
        if not 0 < self.top_p <= 1:
            _fail(f"top_p must be in (0, 1], got {self.top_p:g}")
        if self.top_k < -1:
            _fail(f"top_k must be -1, 0 (off) or >= 1, got {self.top_k}")
        self._set("top_k", max(self.top_k, 0))
        if not 0 <= self.min_p <= 1:
            _fail(f"min_p must be in [0, 1], got {self.min_p:g}")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2 <= getattr(self, name) <= 2:
                _fail(f"{name} must be in [-2, 2], got {getattr(self, name):g}")
        if self.repetition_penalty <= 0:
            _fail(f"repetition_penalty must be > 0, got {self.repetition_penalty:g}")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SamplingParams:
        """Build from a wire/JSON map; unknown keys are an error that lists them."""
        if not isinstance(data, dict):
            _fail(f"params must be a map, got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(str(key) for key in data if key not in known)
        if unknown:
            _fail(f"unknown sampling parameter(s): {', '.join(unknown)} "
                  f"(known: {', '.join(sorted(known))})")
        return cls(**data)

    @property
    def is_greedy(self) -> bool:
        return self.temperature < GREEDY_TEMPERATURE

    @property
    def sampling_type(self) -> SamplingType:
        return SamplingType.GREEDY if self.is_greedy else SamplingType.RANDOM

    @property
    def needs_penalties(self) -> bool:
        """Whether the sampler needs this request's prompt and output token ids."""
        return (self.presence_penalty != 0 or self.frequency_penalty != 0
                or self.repetition_penalty != 1)

    def row_values(self) -> SamplingRowValues:
        """Values for tensor prep. Greedy rows get neutral truncation (it cannot change the
        argmax) so their logprobs are those of the penalized model distribution."""
        greedy = self.is_greedy
        return SamplingRowValues(
            temperature=0.0 if greedy else self.temperature,
            top_p=1.0 if greedy else self.top_p,
            top_k=0 if greedy else self.top_k,
            min_p=0.0 if greedy else self.min_p,
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            repetition_penalty=self.repetition_penalty,
            num_logprobs=-1 if self.logprobs is None else self.logprobs,
        )
