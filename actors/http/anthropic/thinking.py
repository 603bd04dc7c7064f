"""Anthropic's `thinking` field -> the chat template's `enable_thinking` (with --reasoning-parser).

    {"type": "enabled", "budget_tokens": 2048}  -> enable_thinking: true   (a 400 without a reasoning parser)
    {"type": "disabled"}                        -> enable_thinking: false  (nothing without one)
    absent                                      -> the template's default

They go over the server's --default-chat-template-kwargs, as chat completions' variables do. The
answer's reasoning becomes its thinking block (blocks.py). `budget_tokens` is checked as Anthropic
checks it (>= 1024, < max_tokens), but the engine has no separate thinking budget: max_tokens bounds
the whole answer, thinking and text together.
"""

from __future__ import annotations

from typing import Any

from pipeline.request.untrusted import UntrustedValueError

MIN_BUDGET_TOKENS = 1024


def template_kwargs(thinking: Any, defaults: dict[str, Any] | None,
                    reasoning_parser: str | None) -> dict[str, Any] | None:
    """The variables the chat template renders with (None: none); UntrustedValueError naming `thinking`."""
    merged = dict(defaults or {})
    enabled = _enabled(thinking)
    if enabled and reasoning_parser is None:
        raise UntrustedValueError("thinking enabled needs a reasoning model served with --reasoning-parser",
                                  "thinking")
    if enabled is not None and reasoning_parser is not None:
        merged["enable_thinking"] = enabled
    return merged or None


def check_budget(thinking: Any, max_tokens: int) -> None:
    """Anthropic's rules for an enabled thinking's budget_tokens."""
    if not _enabled(thinking):
        return
    budget = thinking.get("budget_tokens")
    if not isinstance(budget, int) or isinstance(budget, bool) or budget < MIN_BUDGET_TOKENS:
        raise UntrustedValueError(f"thinking.budget_tokens must be an integer >= {MIN_BUDGET_TOKENS}, got {budget!r}",
                                  "thinking")
    if budget >= max_tokens:
        raise UntrustedValueError(f"thinking.budget_tokens must be less than max_tokens ({max_tokens}), got {budget}",
                                  "thinking")


def _enabled(thinking: Any) -> bool | None:
    """True or False as `thinking` asks; None when absent."""
    if thinking is None:
        return None
    kind = thinking.get("type") if isinstance(thinking, dict) else None
    if kind not in ("enabled", "disabled"):
        raise UntrustedValueError("thinking must be {type: enabled, budget_tokens} or {type: disabled}", "thinking")
    allowed = {"type", "budget_tokens"} if kind == "enabled" else {"type"}
    unknown = sorted(str(key) for key in thinking if key not in allowed)
    if unknown:
        raise UntrustedValueError(f"thinking: unknown field(s) {', '.join(unknown)}", "thinking")
    return kind == "enabled"
