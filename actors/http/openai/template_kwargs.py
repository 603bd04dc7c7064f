"""A chat body's variables for the chat template: the server's `--default-chat-template-kwargs`, then
OpenAI's `reasoning_effort` (as the template variable of that name), then vLLM's
`chat_template_kwargs`, each over the one before. They travel on the wire (`chat_template_kwargs`) to
the worker that renders the template, and say whether thinking is on (actors/http/reasoning/formats.py).
"""

from __future__ import annotations

from typing import Any

from pipeline.request.chat_template_kwargs import check_chat_template_kwargs
from pipeline.request.untrusted import UntrustedValueError

REASONING_EFFORTS = ("low", "medium", "high")


def take_template_kwargs(params: dict[str, Any], defaults: dict[str, Any] | None) -> dict[str, Any] | None:
    """Pops `chat_template_kwargs` and `reasoning_effort` off a chat body's fields; the variables the
    template renders with (None: none). UntrustedValueError naming the field."""
    given = params.pop("chat_template_kwargs", None)
    effort = params.pop("reasoning_effort", None)
    if given is not None:
        check_chat_template_kwargs(given)
    if effort is not None and effort not in REASONING_EFFORTS:
        raise UntrustedValueError(f"reasoning_effort must be one of {', '.join(REASONING_EFFORTS)}, got {effort!r}",
                                  "reasoning_effort")
    merged = {**(defaults or {}), **({"reasoning_effort": effort} if effort is not None else {}), **(given or {})}
    return merged or None
