"""SamplingParams: the per-request sampling knobs, with OpenAI/vLLM/Aphrodite names, defaults and validation.

Every error is a ValueError that names the field and the rule (`max_tokens must be >= 1, got 0`),
including type errors, so the gateway can return them to the client as they are. `from_dict`
rejects unknown keys: a typo such as `temprature` must fail loudly, never sample at T=1.
The meaning of every sampler field, and the order the sampler applies them in, is docs/sampling.md.
Checks that need the model (vocabulary size, context length, --max-logprobs) are at intake.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, fields
from typing import Any

from pipeline.request.param_checks import (
    check_bool,
    check_int,
    check_range,
    fail,
    normalize_logit_bias,
    normalize_strings,
    normalize_token_ids,
    to_float,
)
from pipeline.request.structured_output import ALIASES, canonical_structured_output

__all__ = ["GREEDY_TEMPERATURE", "MAX_N", "SamplingParams", "SamplingType"]

MAX_N = 128  # choices per request: each is a sequence with its own KV blocks
NULL_IS_A_VALUE = frozenset({"max_tokens"})  # the fields whose null is not their default
# Below this temperature logits / T overflows float32 for ordinary logits; such requests are
# greedy (as in vLLM), which is also what the user meant.
GREEDY_TEMPERATURE = 1e-5
MAX_LOGIT_BIAS = 100.0  # OpenAI's range
DEFAULT_DRY_SEQUENCE_BREAKERS = ("\n", ":", '"', "*")  # text-generation-webui's defaults
# Per-request work that grows with a list's size (stop matching on every token, a breaker mask over
# the vocabulary, a bias row) is bounded here, so no single request can stall a step for the others.
# (field, most items, longest item in characters; None for id lists)
LIST_LIMITS: tuple[tuple[str, int, int | None], ...] = (
    ("stop", 64, 512),
    ("dry_sequence_breakers", 64, 64),
    ("stop_token_ids", 1024, None),
    ("custom_token_bans", 4096, None),
    ("logit_bias", 1024, None),
)

_FLOAT_FIELDS = ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty",
                 "top_a", "tfs", "eta_cutoff", "epsilon_cutoff", "typical_p", "smoothing_factor", "smoothing_curve",
                 "dynatemp_min", "dynatemp_max", "dynatemp_exponent", "mirostat_tau", "mirostat_eta",
                 "dry_multiplier", "dry_base", "xtc_threshold", "xtc_probability", "length_penalty",
                 "repetition_penalty_slope")
_INT_FIELDS = ("n", "min_tokens", "top_k", "mirostat_mode", "dry_allowed_length", "dry_range",
               "repetition_penalty_range")
_OPTIONAL_INT_FIELDS = ("best_of", "max_tokens", "seed", "logprobs", "prompt_logprobs", "truncate_prompt_tokens")
_BOOL_FIELDS = ("ignore_eos", "include_stop_str_in_output", "skip_special_tokens", "spaces_between_special_tokens",
                "use_beam_search", "speculative")
# (field, low, high, low_open, high_open); None = unbounded on that side.
_RANGES: tuple[tuple[str, float | None, float | None, bool, bool], ...] = (
    ("temperature", 0, None, False, False),
    ("top_p", 0, 1, True, False),
    ("min_p", 0, 1, False, False),
    ("presence_penalty", -2, 2, False, False),
    ("frequency_penalty", -2, 2, False, False),
    ("repetition_penalty", 0, None, True, False),
    ("repetition_penalty_range", 0, None, False, False),
    ("repetition_penalty_slope", 0, 1, True, False),
    ("top_a", 0, None, False, False),
    ("tfs", 0, 1, True, False),
    ("eta_cutoff", 0, None, False, False),
    ("epsilon_cutoff", 0, 1000, False, False),
    ("typical_p", 0, 1, True, False),
    ("smoothing_factor", 0, None, False, False),
    ("smoothing_curve", 1, None, False, False),
    ("dynatemp_min", 0, None, False, False),
    ("dynatemp_max", 0, None, False, False),
    ("dynatemp_exponent", 0, None, False, False),
    ("mirostat_tau", 0, None, False, False),
    ("mirostat_eta", 0, None, False, False),
    ("dry_multiplier", 0, None, False, False),
    ("dry_base", 1, None, True, False),
    ("dry_allowed_length", 1, None, False, False),
    ("dry_range", 0, None, False, False),
    ("xtc_threshold", 0, 1, True, False),
    ("xtc_probability", 0, 1, False, False),
)


class SamplingType(enum.IntEnum):
    GREEDY = 0
    RANDOM = 1  # always seeded: an explicit seed or one derived from the request id (docs/design.md §5)


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """Sampling parameters of one request. Lists become tuples, logit_bias sorted (id, bias) pairs."""

    n: int = 1
    best_of: int | None = None  # choices generated (>= n; the n best are returned); None = n
    max_tokens: int | None = 16  # None = until max_model_len
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1 = off; 0 is an error (docs/sampling.md)
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    # KoboldAI's rep_pen_range and rep_pen_slope (docs/sampling.md stage 2): the penalty covers the last
    # `range` tokens of prompt + output (0 = all of them); the older half of that window gets the
    # penalty 1 + (r - 1) * slope when r > 1.
    repetition_penalty_range: int = 0
    repetition_penalty_slope: float = 1.0
    seed: int | None = None  # None = derived from the request id (pipeline.sampling.rng.request_seed)
    # Annotated with the normalized types; construction also accepts a str, a list or None.
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    min_tokens: int = 0
    logprobs: int | None = None  # None = none; k = chosen token + top-k alternatives
    prompt_logprobs: int | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    truncate_prompt_tokens: int | None = None  # keep only the last k prompt tokens
    # Aphrodite's samplers (docs/sampling.md). Every default switches its stage off.
    top_a: float = 0.0
    tfs: float = 1.0
    eta_cutoff: float = 0.0  # units of 1e-4
    epsilon_cutoff: float = 0.0  # units of 1e-4
    typical_p: float = 1.0
    smoothing_factor: float = 0.0
    smoothing_curve: float = 1.0
    dynatemp_min: float = 0.0
    dynatemp_max: float = 0.0
    dynatemp_exponent: float = 1.0
    mirostat_mode: int = 0  # 0 = off, 2 = mirostat v2
    mirostat_tau: float = 0.0
    mirostat_eta: float = 0.0
    custom_token_bans: tuple[int, ...] = ()
    logit_bias: tuple[tuple[int, float], ...] = ()  # construction also accepts {id: bias}
    dry_multiplier: float = 0.0
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    dry_sequence_breakers: tuple[str, ...] = DEFAULT_DRY_SEQUENCE_BREAKERS
    dry_range: int = 0  # 0 = the whole context
    xtc_threshold: float = 0.1
    xtc_probability: float = 0.0
    # Beam search (docs/sampling.md): greedy only; best_of is the beam width W > 1 and n <= W results come back.
    use_beam_search: bool = False
    length_penalty: float = 1.0
    early_stopping: bool | str = False
    # Structured outputs (pipeline/request/structured_output.py). Every spelling folds into
    # structured_outputs, canonical (kind, spec, whitespace_pattern); the aliases are then None.
    structured_outputs: tuple[str, str, str] | None = None
    response_format: Any = None
    guided_json: Any = None
    guided_regex: Any = None
    guided_choice: Any = None
    guided_grammar: Any = None
    guided_whitespace_pattern: Any = None
    # False: never draft tokens for this request, even when the engine speculates (docs/speculative.md).
    speculative: bool = True

    def __post_init__(self) -> None:
        self._fold_structured_output()
        self._check_types()
        self._check_sizes()
        self._check_counts()
        self._check_ranges()
        self._check_beam_search()

    def _set(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)  # frozen: normalization happens only here

    def _fold_structured_output(self) -> None:
        given = {name: getattr(self, name) for name in (*ALIASES, "structured_outputs")}
        self._set("structured_outputs", canonical_structured_output(given, self.guided_whitespace_pattern))
        for name in (*ALIASES, "guided_whitespace_pattern"):
            self._set(name, None)

    def _check_types(self) -> None:
        for name in _INT_FIELDS:
            check_int(name, getattr(self, name))
        for name in _OPTIONAL_INT_FIELDS:
            check_int(name, getattr(self, name), optional=True)
        for name in _BOOL_FIELDS:
            check_bool(name, getattr(self, name))
        for name in _FLOAT_FIELDS:
            self._set(name, to_float(name, getattr(self, name)))
        self._set("stop", normalize_strings("stop", self.stop, allow_single=True))
        self._set("dry_sequence_breakers", normalize_strings("dry_sequence_breakers", self.dry_sequence_breakers,
                                                             allow_single=False))
        self._set("stop_token_ids", normalize_token_ids("stop_token_ids", self.stop_token_ids))
        self._set("custom_token_bans", normalize_token_ids("custom_token_bans", self.custom_token_bans))
        self._set("logit_bias", normalize_logit_bias(self.logit_bias, MAX_LOGIT_BIAS))

    def _check_sizes(self) -> None:
        for name, most_items, longest in LIST_LIMITS:
            items = getattr(self, name)
            if len(items) > most_items:
                fail(f"{name} may hold at most {most_items} items, got {len(items)}")
            if longest is not None and any(len(item) > longest for item in items):
                fail(f"{name} items may be at most {longest} characters long, got one of "
                     f"{max(len(item) for item in items)}")

    def _check_counts(self) -> None:
        if not 1 <= self.n <= MAX_N:
            fail(f"n must be in [1, {MAX_N}], got {self.n}")
        if self.best_of is not None and not self.n <= self.best_of <= MAX_N:
            fail(f"best_of must be None or in [n ({self.n}), {MAX_N}], got {self.best_of}")
        self._set("best_of", self.n if self.best_of is None else self.best_of)
        # 0: the prompt is only scored (prompt_logprobs; the completions API's echo), nothing generated.
        if self.max_tokens is not None and self.max_tokens < 0:
            fail(f"max_tokens must be >= 0, got {self.max_tokens}")
        if self.min_tokens < 0:
            fail(f"min_tokens must be >= 0, got {self.min_tokens}")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            fail(f"min_tokens must be <= max_tokens ({self.max_tokens}), got {self.min_tokens}")
        for name in ("logprobs", "prompt_logprobs"):  # the upper bound is --max-logprobs, at intake
            value = getattr(self, name)
            if value is not None and value < 0:
                fail(f"{name} must be >= 0 or None, got {value}")
        if self.truncate_prompt_tokens is not None and self.truncate_prompt_tokens < 1:
            fail(f"truncate_prompt_tokens must be >= 1 or None, got {self.truncate_prompt_tokens}")

    def _check_ranges(self) -> None:
        if self.top_k == 0 or self.top_k < -1:
            fail(f"top_k must be -1 (off) or >= 1, got {self.top_k}")
        for name, low, high, low_open, high_open in _RANGES:
            check_range(name, getattr(self, name), low, high, low_open=low_open, high_open=high_open)
        if self.mirostat_mode not in (0, 2):
            fail(f"mirostat_mode must be 0 (off) or 2 (mirostat v2), got {self.mirostat_mode}")
        if self.dynatemp_min > self.dynatemp_max:
            fail(f"dynatemp_min must be <= dynatemp_max ({self.dynatemp_max:g}), got {self.dynatemp_min:g}")

    def _check_beam_search(self) -> None:
        if not (isinstance(self.early_stopping, bool) or self.early_stopping == "never"):
            fail(f"early_stopping must be true, false or \"never\", got {self.early_stopping!r}")
        if not self.use_beam_search:
            if self.length_penalty != 1.0:
                fail(f"length_penalty must be 1 without use_beam_search (it only applies to beam search), "
                     f"got {self.length_penalty:g}")
            if self.early_stopping is not False:
                fail(f"early_stopping must be false without use_beam_search (it only applies to beam search), "
                     f"got {self.early_stopping!r}")
            return
        if self.structured_outputs is not None:
            fail("structured outputs cannot be combined with use_beam_search (a beam's candidates would each need "
                 "their own grammar state)")
        if not self.is_greedy:
            fail(f"temperature must be 0 with use_beam_search (beam search is greedy), got {self.temperature:g}"
                 + (" with dynatemp" if self.uses_dynatemp else ""))
        if self.max_tokens == 0:
            fail("max_tokens must be >= 1 with use_beam_search (a beam needs tokens to rank), got 0")
        if self.best_of < 2:
            fail(f"best_of (the beam width) must be > 1 with use_beam_search, got {self.best_of}")
        if self.logprobs is not None:
            fail(f"logprobs is not supported with use_beam_search (a hypothesis keeps its tokens and score, "
                 f"not per-token logprobs), got {self.logprobs}")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SamplingParams:
        """Build from a wire/JSON map; unknown keys are an error that lists them; null is absent."""
        if not isinstance(data, dict):
            fail(f"params must be a map, got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(str(key) for key in data if key not in known)
        if unknown:
            fail(f"unknown sampling parameter(s): {', '.join(unknown)} (known: {', '.join(sorted(known))})")
        # null means "not given" (SDKs send nulls for unset fields), except max_tokens: null = until the context
        return cls(**{key: value for key, value in data.items() if value is not None or key in NULL_IS_A_VALUE})

    @property
    def ranks_choices(self) -> bool:
        """best_of > n without beam search: the n best (by cumulative logprob) of best_of samples."""
        return self.best_of > self.n and not self.use_beam_search

    @property
    def reports_at_end(self) -> bool:
        """Which choices come back is only known when all have ended (best_of > n, beam search),
        so such a request streams nothing until then."""
        return self.best_of > self.n or self.use_beam_search

    @property
    def num_generated_choices(self) -> int:
        """Sequences a request starts with: one beam (it forks as it goes), else best_of choices."""
        return 1 if self.use_beam_search else self.best_of

    @property
    def uses_dynatemp(self) -> bool:
        return self.dynatemp_min > 0 or self.dynatemp_max > 0

    @property
    def uses_mirostat(self) -> bool:
        return self.mirostat_mode == 2

    @property
    def is_greedy(self) -> bool:
        """Dynamic temperature replaces `temperature`, so a dynatemp request is never greedy."""
        return self.temperature < GREEDY_TEMPERATURE and not self.uses_dynatemp

    @property
    def sampling_type(self) -> SamplingType:
        return SamplingType.GREEDY if self.is_greedy else SamplingType.RANDOM

    @property
    def needs_penalties(self) -> bool:
        """Whether the sampler needs this request's prompt and output token ids."""
        return (self.presence_penalty != 0 or self.frequency_penalty != 0
                or self.repetition_penalty != 1)
