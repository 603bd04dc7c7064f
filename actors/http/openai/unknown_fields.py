"""Top-level request fields nobody defined, handled as vLLM does: accepted, logged, and named back.

vLLM's request models allow extra fields and log "the following fields were present in the
request but ignored"; clients and frameworks send such fields all the time (a newer SDK's field,
a provider-specific knob). Here they are taken off the body before the strict parsers see it, and
the response names them in `X-Ignored-Fields` (actors/http/generation/request.py) so the client can
see what had no effect (vLLM only logs them). `aqueduct serve --strict-fields` keeps the old
behaviour: a 400 naming the field.

A field this module knows is never taken off: the parsers decide about it, so a known field we do
not implement (vLLM's `chat_template`, `bad_words`, ...) is still an error.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from actors.http.errors import invalid
from pipeline.request.sampling_params import SamplingParams

# Every field of OpenAI's completion and chat request objects and the HTTP-only ones: whatever the
# parsers do with them (use, ignore as documented, or refuse), they are not "unknown".
_OPENAI_FIELDS = frozenset({
    "model", "prompt", "messages", "stream", "stream_options", "echo", "suffix", "user", "metadata", "store",
    "service_tier", "max_completion_tokens", "top_logprobs", "tools", "tool_choice", "functions",
    "function_call", "parallel_tool_calls", "audio", "modalities", "prediction", "reasoning_effort",
    "web_search_options", "verbosity", "prompt_cache_key", "safety_identifier"})
# OpenAI fields that change what a model would answer and that this server does not implement.
_OPENAI_NOT_IMPLEMENTED = frozenset({"reasoning_effort", "web_search_options", "verbosity"})
# OpenAI fields that are only the client's bookkeeping (like `user`): accepted, no effect.
_OPENAI_BOOKKEEPING = frozenset({"prompt_cache_key", "safety_identifier"})
# vLLM's own request extras that change the answer and are not implemented here: an error, never
# silently ignored (a vLLM client relying on them would get different output without knowing).
_VLLM_NOT_IMPLEMENTED = frozenset({
    "chat_template", "chat_template_kwargs", "add_generation_prompt", "continue_final_message", "documents",
    "mm_processor_kwargs", "allowed_token_ids", "bad_words", "return_tokens_as_token_ids",
    "guided_decoding_backend", "add_special_tokens", "logits_processors", "vllm_xargs", "kv_transfer_params",
    "cache_salt", "return_token_ids", "reasoning_parser"})
_NOT_IMPLEMENTED = _OPENAI_NOT_IMPLEMENTED | _VLLM_NOT_IMPLEMENTED
# The chat template's variables: chat's parser takes them; a completions prompt has no template.
_CHAT_ONLY = frozenset({"reasoning_effort", "chat_template_kwargs"})
# Values of those that ask for nothing (vLLM's defaults; clients send them for unset fields).
_ASKS_NOTHING: dict[str, tuple[Any, ...]] = {
    "return_tokens_as_token_ids": (False,), "return_token_ids": (False,), "bad_words": ([],),
    "add_generation_prompt": (True,), "continue_final_message": (False,), "chat_template_kwargs": ({},),
    "documents": ([],), "mm_processor_kwargs": ({},), "logits_processors": ([],)}
# add_special_tokens' default depends on the endpoint: the chat template writes its own BOS.
_ADD_SPECIAL_TOKENS_DEFAULT = {True: False, False: True}  # chat -> False, completions -> True
_SAMPLING_FIELDS = frozenset(SamplingParams.__dataclass_fields__)


def take_unknown_fields(body: dict[str, Any], strict: bool, chat: bool) -> tuple[dict[str, Any], tuple[str, ...]]:
    """(the body without its unknown top-level fields, their names, sorted). Known fields that ask
    for something this server does not do are a 400 naming them, in both modes."""
    not_implemented = _NOT_IMPLEMENTED - _CHAT_ONLY if chat else _NOT_IMPLEMENTED
    _refuse_not_implemented(body, chat, not_implemented)
    body = _without(body, lambda key: key in not_implemented or key in _OPENAI_BOOKKEEPING)  # ask nothing by now
    if strict:
        return body, ()  # the parsers answer an unknown field with a 400 naming it
    unknown = tuple(sorted(str(key) for key in body if not _is_known(key)))
    return _without(body, lambda key: not _is_known(key)), unknown


def _is_known(key: str) -> bool:
    return key in _OPENAI_FIELDS or key in _SAMPLING_FIELDS or key in _VLLM_NOT_IMPLEMENTED


def _without(body: dict[str, Any], drop: Callable[[str], bool]) -> dict[str, Any]:
    return {key: value for key, value in body.items() if not drop(key)}


def _refuse_not_implemented(body: dict[str, Any], chat: bool, not_implemented: frozenset[str]) -> None:
    """A value that asks for vLLM's default is accepted: clients send defaults for unset fields."""
    for key in sorted(body.keys() & not_implemented):
        value = body[key]
        defaults = (_ADD_SPECIAL_TOKENS_DEFAULT[chat],) if key == "add_special_tokens" else _ASKS_NOTHING.get(key, ())
        if value is not None and not any(value == default and type(value) is type(default) for default in defaults):
            raise invalid(f"{key} is not supported by this server", key)
