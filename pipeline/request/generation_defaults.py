"""A model's own sampling defaults (its generation_config.json), applied as vLLM applies them.

A field the request gives wins; a field it leaves out (or sends as null) takes the model's value,
and only then the sampler's default. `max_new_tokens` is different: a cap on every request's
`max_tokens`, an absent or null one included (vLLM's "server-wide limit").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pipeline.request.sampling_params import NULL_IS_A_VALUE


@dataclass(frozen=True, slots=True)
class GenerationDefaults:
    sampling: Mapping[str, Any] = field(default_factory=dict)  # wire names: temperature, top_p, ...
    max_tokens: int | None = None  # generation_config's max_new_tokens: the most any request generates

    def __bool__(self) -> bool:
        return bool(self.sampling) or self.max_tokens is not None

    def apply(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """A request's wire params with the model's defaults filled in (validated later, by SamplingParams)."""
        given = {key: value for key, value in params.items() if value is not None or key in NULL_IS_A_VALUE}
        return {**self.sampling, **given}

    def capped_max_tokens(self, max_tokens: int | None, room: int) -> int | None:
        """A request's max_tokens under max_new_tokens; `None` (until the context is full) becomes the
        cap or the `room` left in the context, whichever is smaller, so it never exceeds the context."""
        if self.max_tokens is None:
            return max_tokens
        if max_tokens is None:
            return max(1, min(self.max_tokens, room))
        return min(max_tokens, self.max_tokens)
